"""Find receiver modules in every installed app (``receivers.py`` by default), and task
modules (``tasks.py``) when a ``TASKS`` backend is ours.

``consumers.py``, the default before 1.0, is still imported: it is also the module name of
Django Channels, so a check (W002) asks to move receivers out of it when Channels is
installed (their queue names follow the function's dotted path unless ``queue=`` is given).
"""

from __future__ import annotations

from django.utils.module_loading import autodiscover_modules

from ..conf import app_settings
from .task_api import task_api_module, uses_task_backend

#: The receiver module name before 1.0, still discovered.
LEGACY_MODULE = "consumers"


def autodiscover() -> None:
    """Import ``<app>.<DISCOVER_MODULE>`` (and ``<app>.consumers``) for every installed app.
    Idempotent: Python caches imported modules and the registry ignores a function
    registered twice.

    With our task backend configured, also ``<app>.tasks``: a task's queue exists (and a
    consumer runs it) once its ``@task`` was imported, as a receiver's once its module was.
    Not when this Django has no task API (Django < 6.0 without the backport): those
    modules would fail on their first import line, so the check E040 says what to install
    instead of a traceback from ``ready()``.
    """
    autodiscover_modules(app_settings.DISCOVER_MODULE)
    if app_settings.DISCOVER_MODULE != LEGACY_MODULE:
        autodiscover_modules(LEGACY_MODULE)
    if uses_task_backend() and task_api_module() is not None:
        autodiscover_modules("tasks")
