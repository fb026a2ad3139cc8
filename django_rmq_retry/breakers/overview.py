"""Every configured dependency as operators see it: the admin's page, ``rmq_dependencies``
and the metrics read this (a few small queries, never the parked table)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from ..conf import dependency_limits
from ..core.breaker import Breaker, Limits, State
from ..registry import default_registry
from . import state


@dataclass(frozen=True)
class View:
    """One dependency now."""

    name: str
    limits: Limits
    breaker: Breaker
    failures: int  # listed failures within TRIP_WINDOW (the count towards a trip)
    receivers: list[str]  # the receivers that depend on it, in this process's registry

    @property
    def state(self) -> State:
        return self.breaker.state

    @property
    def next_probe(self) -> datetime | None:
        """When the next probe may run (open), or until when this one holds (half-open)."""
        if self.state is State.OPEN:
            return self.breaker.next_probe_at
        if self.state is State.HALF_OPEN:
            return self.breaker.probe_until
        return None


def views(now: datetime | None = None) -> list[View]:
    """Every dependency of ``DEPENDENCIES``, by name (a missing row is created closed)."""
    limits = dependency_limits()
    now = now or timezone.now()
    breakers = state.read_all(sorted(limits))
    everyone = default_registry.all()
    return [
        View(
            name,
            limits[name],
            breakers[name],
            state.failures_in_window(name, now),
            [r.name for r in everyone if name in r.depends_on],
        )
        for name in sorted(limits)
    ]


def describe(view: View) -> str:
    """One line for a terminal."""
    b = view.breaker
    since = b.since.isoformat(timespec="seconds") if b.since else "-"
    probe = view.next_probe
    parts = [
        f"{view.name}: {view.state.value}",
        f"since {since}",
        f"failures in window {view.failures}/{view.limits.trip_failures} "
        f"({view.limits.trip_window:g}s)",
        f"trips {b.trips}",
    ]
    if probe is not None:
        parts.append(f"next probe {probe.isoformat(timespec='seconds')}")
    if b.reason:
        parts.append(f"why: {b.reason}")
    return "; ".join(parts)
