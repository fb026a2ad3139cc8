"""``django.tasks`` on RabbitMQ (Django 6.0+): ``TASKS = {"default": {"BACKEND":
"django_rmq_retry.tasks.RabbitMQBackend"}}``. See ``backend`` for how a task travels."""

from __future__ import annotations

from .backend import RabbitMQBackend, RabbitMQTask

__all__ = ["RabbitMQBackend", "RabbitMQTask"]
