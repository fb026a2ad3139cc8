"""Find receiver modules in every installed app (``consumers.py`` by default)."""

from __future__ import annotations

from django.utils.module_loading import autodiscover_modules

from .conf import app_settings


def autodiscover() -> None:
    """Import ``<app>.<DISCOVER_MODULE>`` for every installed app. Idempotent: Python caches
    imported modules and the registry ignores a function registered twice."""
    autodiscover_modules(app_settings.DISCOVER_MODULE)
