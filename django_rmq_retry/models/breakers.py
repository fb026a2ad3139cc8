"""Database state of the dependency breakers (``core.breaker``), shared by every process:
one row per dependency that every consumer process steps with conditional updates, the
failures that count towards a trip, and the history of its transitions.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..core.breaker import State

STATE_LABELS = {
    State.CLOSED: _("Closed (running)"),
    State.HALF_OPEN: _("Half-open (one probe)"),
    State.OPEN: _("Open (the broker keeps the messages)"),
}
STATE_CHOICES = [(state.value, STATE_LABELS[state]) for state in State]


class Dependency(models.Model):
    """One dependency's breaker (``RMQ_RETRY["DEPENDENCIES"]``), created on first use.

    Every write is one conditional ``UPDATE ... WHERE version = read version``
    (``breakers.state``): two processes stepping it at once, one wins, the other reads
    again. A delivery that runs never writes here; only listed failures and transitions do.
    """

    name = models.CharField(_("dependency"), max_length=100, unique=True)
    state = models.CharField(
        _("state"), max_length=10, choices=STATE_CHOICES, default=State.CLOSED.value
    )
    since = models.DateTimeField(_("since"), null=True, blank=True)
    reason = models.TextField(_("why"), blank=True)
    #: Seconds this opening waits before its next probe (PROBE_AFTER, doubled per failure).
    probe_wait = models.FloatField(_("probe wait (s)"), default=0.0)
    next_probe_at = models.DateTimeField(_("next probe at"), null=True, blank=True)
    #: The process holding the half-open probe, and until when that holds.
    probe_owner = models.CharField(_("probe owner"), max_length=64, blank=True)
    probe_until = models.DateTimeField(_("probe lease until"), null=True, blank=True)
    trips = models.PositiveIntegerField(_("trips"), default=0)
    version = models.PositiveBigIntegerField(_("version"), default=0)

    class Meta:
        verbose_name = _("dependency")
        verbose_name_plural = _("dependencies")
        ordering = ("name",)
        permissions = [("operate_dependency", _("Can open and close dependency breakers"))]

    def __str__(self) -> str:
        return f"{self.name}: {self.state}"


class DependencyFailure(models.Model):
    """A listed failure of a dependent receiver while the breaker was closed: the rows
    within ``TRIP_WINDOW`` are the count that trips it (older ones are deleted)."""

    dependency = models.CharField(_("dependency"), max_length=100)
    at = models.DateTimeField(_("at"))

    class Meta:
        verbose_name = _("dependency failure")
        verbose_name_plural = _("dependency failures")
        indexes = [models.Index(fields=["dependency", "at"], name="rmqr_dep_fail_at")]

    def __str__(self) -> str:
        return f"{self.dependency} failed at {self.at}"


class DependencyEvent(models.Model):
    """One transition of a breaker: the trip history the admin shows."""

    dependency = models.CharField(_("dependency"), max_length=100)
    at = models.DateTimeField(_("at"))
    from_state = models.CharField(_("from"), max_length=10, choices=STATE_CHOICES)
    to_state = models.CharField(_("to"), max_length=10, choices=STATE_CHOICES)
    reason = models.TextField(_("why"), blank=True)
    by = models.CharField(_("by"), max_length=150, blank=True)

    class Meta:
        verbose_name = _("dependency event")
        verbose_name_plural = _("dependency events")
        ordering = ("-at", "-id")
        indexes = [models.Index(fields=["dependency", "at"], name="rmqr_dep_event_at")]

    def __str__(self) -> str:
        return f"{self.dependency}: {self.from_state} -> {self.to_state}"
