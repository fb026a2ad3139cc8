"""App configs: the default one discovers receiver modules; the simple one does not."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SimpleRmqRetryConfig(AppConfig):
    """Use this in INSTALLED_APPS to skip discovery and import receiver modules yourself."""

    name = "django_rmq_retry"
    label = "django_rmq_retry"
    verbose_name = _("RabbitMQ retries")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)


class RmqRetryConfig(SimpleRmqRetryConfig):
    """Default: imports ``<app>.receivers`` (and ``consumers``) of every installed app, like admin.autodiscover()."""

    default = True

    def ready(self) -> None:
        super().ready()
        from .registry.discovery import autodiscover

        autodiscover()
