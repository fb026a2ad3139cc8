"""The Celery app of the Celery bridge row (django-tasks-celery): configured from the Django
settings' ``CELERY_*`` names, as Celery's Django guide sets a project up."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.tasks_settings")
app = Celery("benchtasks")
app.config_from_object("django.conf:settings", namespace="CELERY")
