"""The breakers' rows: read them, step them, count failures (``core.breaker`` decides).

Every transition is one conditional ``UPDATE ... WHERE name = %s AND version = %s`` of the
dependency's row: of two processes stepping it at once one wins, the other reads the row
again and decides again (usually: nothing left to do). A delivery that runs writes nothing;
a listed failure while closed inserts one :class:`~django_rmq_retry.models.DependencyFailure`
row and counts the rows within the window: no row lock on the happy path, and the count is
the cluster's, whatever process failed.

The process that wins a trip or a close says so: one log line, one alert
(``breakers.announce``), one history row, whatever the number of processes.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import fields
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import dependency_limits
from ..core.breaker import (
    Breaker,
    Limits,
    State,
    claim_probe,
    forced,
    probe_dropped,
    probe_failed,
    probe_passed,
    trip_reason,
    tripped,
)
from ..models import Dependency, DependencyEvent, DependencyFailure
from . import announce, replay

logger = logging.getLogger("django_rmq_retry.breakers")

#: The row's columns that mirror the core's snapshot, in its field order.
_COLUMNS = [f.name for f in fields(Breaker)]


def me() -> str:
    """This process, as a probe's owner: host and pid (a forked child gets its own)."""
    return f"{socket.gethostname()}:{os.getpid()}"[:64]


def limits_of(name: str) -> Limits:
    """``name``'s limits; ``KeyError`` for a dependency the settings do not define."""
    return dependency_limits()[name]


def _snapshot(row: Dependency) -> Breaker:
    values = {column: getattr(row, column) for column in _COLUMNS}
    values["state"] = State(row.state)
    return Breaker(**values)


def read(name: str) -> Breaker:
    """``name``'s breaker now (its row is created, closed, on first use)."""
    return read_all([name])[name]


def read_all(names: Iterable[str]) -> dict[str, Breaker]:
    """The breakers of ``names`` in one query (missing rows created closed)."""
    wanted = list(dict.fromkeys(names))
    rows = {row.name: row for row in Dependency.objects.filter(name__in=wanted)}
    for name in wanted:
        if name not in rows:
            try:
                with transaction.atomic():
                    rows[name] = Dependency.objects.create(name=name)
            except IntegrityError:  # another process created it first
                rows[name] = Dependency.objects.get(name=name)
    return {name: _snapshot(rows[name]) for name in wanted}


def step(name: str, before: Breaker, after: Breaker, *, by: str, now: datetime) -> bool:
    """Write ``after`` if the row is still ``before`` (its version); whether it won.

    The winner writes the history row and announces a trip or a close."""
    values = {column: getattr(after, column) for column in _COLUMNS}
    values["state"] = after.state.value
    won = Dependency.objects.filter(name=name, version=before.version).update(**values)
    if not won:
        return False
    if before.state is not after.state:
        DependencyEvent.objects.create(
            dependency=name,
            at=now,
            from_state=before.state.value,
            to_state=after.state.value,
            reason=after.reason,
            by=by[:150],
        )
        if after.state is State.CLOSED:
            DependencyFailure.objects.filter(dependency=name).delete()  # a fresh count
    announce.transition(name, before, after, by)
    if after.state is State.CLOSED and before.state is not State.CLOSED:
        _replay(name)
    return True


def _replay(name: str) -> None:
    """Requeue what the outage parked (``replay``); a failure to start it never undoes
    the close: it is logged, and an operator can requeue those rows from the admin."""
    try:
        replay.replay(name, limits_of(name))
    except Exception:
        logger.exception("dependency %s: could not start the replay of its parked messages", name)


def _until_settled(
    name: str, decide: Callable[[Breaker], Breaker | None], *, by: str, now: datetime
) -> tuple[Breaker, bool]:
    """Read, decide, step; again while another process won in between. The breaker as it
    is now, and whether this call stepped it."""
    current = read(name)
    while True:
        after = decide(current)
        if after is None:
            return current, False
        if step(name, current, after, by=by, now=now):
            return after, True
        current = read(name)


def record_failure(
    name: str, error_type: str, detail: str, *, now: datetime | None = None
) -> Breaker:
    """A dependent receiver failed with one of ``name``'s exceptions: count it (cluster-wide,
    within ``TRIP_WINDOW``) and trip the breaker when the count is reached. The breaker
    after it (open: this failure, or another process's, tripped it)."""
    limits = limits_of(name)
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=limits.trip_window)
    DependencyFailure.objects.create(dependency=name, at=now)
    DependencyFailure.objects.filter(dependency=name, at__lte=cutoff).delete()
    count = DependencyFailure.objects.filter(dependency=name, at__gt=cutoff).count()
    reason = trip_reason(count, limits.trip_window, error_type, detail)
    breaker, won = _until_settled(
        name, lambda b: tripped(b, count, now, limits, reason), by=me(), now=now
    )
    if won:
        DependencyFailure.objects.filter(dependency=name).delete()  # the next trip counts anew
    return breaker


def failures_in_window(name: str, now: datetime | None = None) -> int:
    """Listed failures counted towards the next trip (the admin shows it)."""
    limits = limits_of(name)
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=limits.trip_window)
    return DependencyFailure.objects.filter(dependency=name, at__gt=cutoff).count()


def claim(name: str, owner: str, *, now: datetime | None = None) -> bool:
    """Claim the half-open probe for ``owner`` if it is due; whether ``owner`` holds it."""
    now = now or timezone.now()
    breaker, _won = _until_settled(name, lambda b: claim_probe(b, now, owner), by=owner, now=now)
    return breaker.state is State.HALF_OPEN and breaker.probe_owner == owner


def probe_result(
    name: str, owner: str, error: tuple[str, str] | None, *, now: datetime | None = None
) -> Breaker:
    """The probe's outcome: ``None`` (it ran) closes, ``(error type, detail)`` opens again
    with a doubled wait. A word from a process that no longer holds it changes nothing."""
    now = now or timezone.now()
    limits = limits_of(name)
    why = f"the probe failed: {error[0]}: {error[1]}"[:500] if error else ""

    def decide(b: Breaker) -> Breaker | None:
        if error is None:
            return probe_passed(b, now, owner)
        return probe_failed(b, now, owner, limits, why)

    return _until_settled(name, decide, by=owner, now=now)[0]


def drop_probe(name: str, owner: str, *, now: datetime | None = None) -> Breaker:
    """``owner`` had nothing to probe with (or stops): open again, anyone probes next."""
    now = now or timezone.now()
    return _until_settled(name, lambda b: probe_dropped(b, now, owner), by=owner, now=now)[0]


def force(name: str, to: State, who: str, *, now: datetime | None = None) -> bool:
    """An operator's "open now" / "close now"; whether it changed anything."""
    now = now or timezone.now()
    limits = limits_of(name)
    return _until_settled(name, lambda b: forced(b, to, now, limits, who), by=who, now=now)[1]


def history(name: str, limit: int = 20) -> list[DependencyEvent]:
    """``name``'s last transitions, newest first."""
    return list(DependencyEvent.objects.filter(dependency=name).order_by("-at", "-id")[:limit])
