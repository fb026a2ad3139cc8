"""Periodic tasks' schedules (``tasks.periodic``), one row each, shared by every consumer.

A row comes from the task backend's ``OPTIONS["periodic"]`` (synced at each consumer's
start) or from the admin. Every consumer process looks for due rows; the one whose
conditional ``UPDATE`` moves ``next_run_at`` on from the due time it read enqueues that
tick, so a tick is enqueued once whatever the number of consumers.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.utils.translation import gettext_lazy as _

from ..core.schedule import Cron, ScheduleError


class PeriodicTask(models.Model):
    SETTINGS = "settings"
    ADMIN = "admin"

    name = models.CharField(_("name"), max_length=200, unique=True)
    task_path = models.CharField(
        _("task"), max_length=255, help_text=_("Dotted path of the @task function.")
    )
    backend = models.CharField(_("backend alias"), max_length=100, default="default")
    args = models.JSONField(_("arguments"), default=list, blank=True)
    kwargs = models.JSONField(_("keyword arguments"), default=dict, blank=True)
    every_seconds = models.FloatField(
        _("every (seconds)"), null=True, blank=True, help_text=_("An interval, or a cron.")
    )
    cron = models.CharField(
        _("cron (UTC)"),
        max_length=100,
        blank=True,
        help_text=_("minute hour day month weekday, read in UTC, e.g. */15 * * * *"),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    source = models.CharField(
        _("declared in"),
        max_length=20,
        default=ADMIN,
        choices=[(SETTINGS, _("settings")), (ADMIN, _("admin"))],
    )
    next_run_at = models.DateTimeField(_("next tick"), null=True, blank=True)
    last_run_at = models.DateTimeField(_("last tick"), null=True, blank=True)
    last_result_id = models.CharField(_("last result id"), max_length=64, blank=True)
    runs = models.PositiveBigIntegerField(_("ticks enqueued"), default=0)

    class Meta:
        verbose_name = _("periodic task")
        verbose_name_plural = _("periodic tasks")
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="rmqr_periodic_due")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if (self.every_seconds is None) == (not self.cron):
            raise ValidationError(_("Give an interval or a cron expression (one of them)."))
        if self.every_seconds is not None and self.every_seconds <= 0:
            raise ValidationError({"every_seconds": _("A positive number of seconds.")})
        if self.cron:
            try:
                Cron.parse(self.cron)
            except ScheduleError as exc:
                raise ValidationError({"cron": str(exc)}) from exc
