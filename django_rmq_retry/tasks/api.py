"""Django's task API, from wherever this Django has it: one import point for the backend.

Django 6.0+ ships it as ``django.tasks``; on Django 5.2 it is the ``django-tasks`` backport
(``django_tasks``), the same classes under another name. Our backend subclasses the
``BaseTaskBackend`` of the one in use and sends its signals, so a project writes
``from django.tasks import task`` on 6.x and ``from django_tasks import task`` on 5.2 and
the same backend runs both. Neither: ``ImproperlyConfigured`` says what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import django
from django.core.exceptions import ImproperlyConfigured

from ..registry.task_api import missing_api_message

if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:  # Django 5.2: the backport
    try:
        from django_tasks import task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImproperlyConfigured(missing_api_message()) from exc

__all__ = [
    "BaseTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
