"""Where this project's Django task API lives, and the check that says when it is missing.

Django 6.0 ships the API as ``django.tasks``; on Django 5.2 the same API is the
``django-tasks`` backport (``django_tasks``, an app of its own). The backend
(``django_rmq_retry.tasks``) imports whichever this Django has; this module only finds out
which (imported by ``ready()`` and the checks only when ``TASKS`` names our backend), so
they say what to install when the API is absent instead of failing on an import.
"""

from __future__ import annotations

import importlib
from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core import checks

#: Our backend's package (``TASKS[...]["BACKEND"]`` starts with it).
TASK_BACKEND_PACKAGE = "django_rmq_retry.tasks"
#: The backport's module and app name.
BACKPORT = "django_tasks"

#: What a project on Django < 6.0 does to get the task API (the error and the check say it).
INSTALL_BACKPORT = (
    "pip install django-tasks (or pip install 'django-rmq-retry[tasks]'), then add "
    "'django_tasks' to INSTALLED_APPS"
)


def task_api_module() -> str | None:
    """``"django.tasks"`` (Django 6.0+), ``"django_tasks"`` (the backport, installed on an
    older Django) or ``None`` (neither: the backend cannot be used)."""
    if django.VERSION >= (6, 0):
        return "django.tasks"
    try:
        importlib.import_module(BACKPORT)
    except ImportError:
        return None
    return BACKPORT


def missing_api_message() -> str:
    return (
        f"TASKS uses {TASK_BACKEND_PACKAGE}.RabbitMQBackend, but Django "
        f"{django.get_version()} has no django.tasks (it comes with Django 6.0): "
        f"{INSTALL_BACKPORT}."
    )


def uses_task_backend() -> bool:
    """``TASKS`` names one of our backends."""
    backends = getattr(settings, "TASKS", None) or {}
    if not isinstance(backends, dict):
        return False
    return any(
        str(options.get("BACKEND", "")).startswith(TASK_BACKEND_PACKAGE + ".")
        for options in backends.values()
        if isinstance(options, dict)
    )


@checks.register("django_rmq_retry")
def check_task_api(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E040: our backend without a task API (Django < 6.0 without the backport); E041: the
    backport installed but not in ``INSTALLED_APPS`` (its checks of ``TASKS`` and its
    signal handlers would not run)."""
    if not uses_task_backend():
        return []
    module = task_api_module()
    if module is None:
        return [
            checks.Error(
                missing_api_message(),
                hint=INSTALL_BACKPORT[0].upper() + INSTALL_BACKPORT[1:] + ".",
                id="django_rmq_retry.E040",
            )
        ]
    if module == BACKPORT and not apps.is_installed(BACKPORT):
        return [
            checks.Error(
                "TASKS uses RabbitMQBackend through the django-tasks backport, but "
                "'django_tasks' is not in INSTALLED_APPS.",
                hint="Add 'django_tasks' to INSTALLED_APPS.",
                id="django_rmq_retry.E041",
            )
        ]
    return []
