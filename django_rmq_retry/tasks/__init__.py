"""Django tasks on RabbitMQ: ``TASKS = {"default": {"BACKEND":
"django_rmq_retry.tasks.RabbitMQBackend"}}``, on Django 6.0+ (``django.tasks``) or on
Django 5.2 with the ``django-tasks`` backport. See ``backend`` for how a task travels."""

from __future__ import annotations

from .api import TaskContext, TaskResultStatus
from .backend import RabbitMQBackend, RabbitMQTask
from .cancel import TaskCancelled, acancel, cancel
from .decorator import task

# ``TaskContext`` and ``TaskResultStatus`` are Django's (or the backport's), named here so that
# a ``tasks.py`` imports the same names on every Django version.
__all__ = [
    "RabbitMQBackend",
    "RabbitMQTask",
    "TaskCancelled",
    "TaskContext",
    "TaskResultStatus",
    "acancel",
    "cancel",
    "task",
]
