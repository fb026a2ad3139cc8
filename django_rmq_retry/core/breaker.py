"""A dependency's breaker: closed, open, half-open. Pure: standard library only.

A dependency (a payment provider, a mail relay) is named in ``RMQ_RETRY["DEPENDENCIES"]``
with the exceptions that mean "it is down". Its breaker is one shared row (every consumer
process reads and steps the same one); this module decides each step from a snapshot of it,
and the caller writes the step with one conditional ``UPDATE`` that expects the snapshot's
``version`` (whoever loses the race reads again). Nothing here reads a clock: every function
is given ``now``.

- **closed**: receivers that depend on it run. ``TRIP_FAILURES`` listed failures within
  ``TRIP_WINDOW`` seconds, counted across every process, trip it: :func:`tripped`.
- **open**: no dependent receiver runs; the broker keeps their messages. After
  ``probe_wait`` seconds (``PROBE_AFTER`` at first) one process claims the probe:
  :func:`claim_probe`.
- **half-open**: exactly one delivery, in the process holding the probe lease, runs.
  It returns: closed (:func:`probe_passed`); it fails with a listed exception: open again,
  the wait doubled up to ``PROBE_BACKOFF_MAX`` (:func:`probe_failed`). A probe whose owner
  died (its lease lapsed) is claimed again by another process.

An operator's "open now" / "close now" is a step like any other (:func:`forced`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from .backoff import matches

#: Seconds a probe's owner holds it: past this with no outcome, another process may probe.
PROBE_LEASE = 60.0

#: The keys of one dependency in ``RMQ_RETRY["DEPENDENCIES"]`` and their defaults.
DEPENDENCY_DEFAULTS: dict[str, Any] = {
    "EXCEPTIONS": [],
    "TRIP_FAILURES": 5,
    "TRIP_WINDOW": 30,
    "PROBE_AFTER": 10,
    "PROBE_BACKOFF_MAX": 300,
    "REPLAY_PARKED": True,
}


class State(str, Enum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"

    @property
    def gauge(self) -> int:
        """The metric's value: 0 closed, 1 half-open, 2 open."""
        return {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}[self]


@dataclass(frozen=True)
class Limits:
    """One dependency's settings, checked."""

    exceptions: tuple[str, ...]
    trip_failures: int = 5
    trip_window: float = 30.0
    probe_after: float = 10.0
    probe_backoff_max: float = 300.0
    replay_parked: bool = True

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Limits:
        """The limits of one ``DEPENDENCIES`` entry; ``ValueError`` names the bad key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"must be a dict, got {type(data).__name__}")
        unknown = sorted(set(data) - set(DEPENDENCY_DEFAULTS))
        if unknown:
            raise ValueError(
                f"unknown key(s) {', '.join(unknown)} (valid: {', '.join(DEPENDENCY_DEFAULTS)})"
            )
        values = {**DEPENDENCY_DEFAULTS, **data}
        exceptions = values["EXCEPTIONS"]
        if isinstance(exceptions, str) or not all(
            isinstance(e, str) and "." in e for e in exceptions or ()
        ):
            raise ValueError(
                "EXCEPTIONS must be a list of dotted paths, e.g. ['builtins.ConnectionError']"
            )
        if not exceptions:
            raise ValueError("EXCEPTIONS is empty: name the exceptions that mean it is down")
        trip_failures = values["TRIP_FAILURES"]
        if not _number(trip_failures, integer=True) or trip_failures < 1:
            raise ValueError(f"TRIP_FAILURES must be an integer >= 1, got {trip_failures!r}")
        for key in ("TRIP_WINDOW", "PROBE_AFTER", "PROBE_BACKOFF_MAX"):
            if not _number(values[key]) or values[key] <= 0:
                raise ValueError(f"{key} must be a number of seconds > 0, got {values[key]!r}")
        if values["PROBE_BACKOFF_MAX"] < values["PROBE_AFTER"]:
            raise ValueError("PROBE_BACKOFF_MAX must be at least PROBE_AFTER")
        if not isinstance(values["REPLAY_PARKED"], bool):
            raise ValueError("REPLAY_PARKED must be True or False")
        return cls(
            exceptions=tuple(exceptions),
            trip_failures=int(trip_failures),
            trip_window=float(values["TRIP_WINDOW"]),
            probe_after=float(values["PROBE_AFTER"]),
            probe_backoff_max=float(values["PROBE_BACKOFF_MAX"]),
            replay_parked=values["REPLAY_PARKED"],
        )

    def listed(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the dependency is down (an instance of a listed class)."""
        return matches(exc, self.exceptions)


def _number(value: Any, *, integer: bool = False) -> bool:
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


@dataclass(frozen=True)
class Breaker:
    """A snapshot of one dependency's row. ``version`` is what a conditional update expects."""

    state: State = State.CLOSED
    since: datetime | None = None
    reason: str = ""
    #: Seconds this opening waits before its (next) probe: PROBE_AFTER, doubled per failure.
    probe_wait: float = 0.0
    next_probe_at: datetime | None = None
    probe_owner: str = ""
    probe_until: datetime | None = None
    trips: int = 0
    version: int = 0

    def _step(self, **changes: Any) -> Breaker:
        return replace(self, version=self.version + 1, **changes)


class Gate(str, Enum):
    """What a delivery of a dependent receiver may do now."""

    RUN = "run"  # closed: run it
    PROBE = "probe"  # half-open and this process holds the probe: run it as the probe
    WAIT = "wait"  # open, or another process probes: the broker keeps it


def gate(b: Breaker, now: datetime, me: str) -> Gate:
    """Whether a delivery may run in process ``me`` (the caller lets one probe at a time)."""
    if b.state is State.CLOSED:
        return Gate.RUN
    if b.state is State.HALF_OPEN and b.probe_owner == me and _held(b, now):
        return Gate.PROBE
    return Gate.WAIT


def _held(b: Breaker, now: datetime) -> bool:
    return b.probe_until is not None and now < b.probe_until


def tripped(
    b: Breaker, failures_in_window: int, now: datetime, limits: Limits, reason: str
) -> Breaker | None:
    """Closed and ``failures_in_window`` reached ``TRIP_FAILURES``: open; else no step."""
    if b.state is not State.CLOSED or failures_in_window < limits.trip_failures:
        return None
    return _opened(b, now, limits.probe_after, reason, trips=b.trips + 1)


def _opened(b: Breaker, now: datetime, wait: float, reason: str, *, trips: int) -> Breaker:
    return b._step(
        state=State.OPEN,
        since=now,
        reason=reason,
        probe_wait=wait,
        next_probe_at=now + timedelta(seconds=wait),
        probe_owner="",
        probe_until=None,
        trips=trips,
    )


def probe_due(b: Breaker, now: datetime) -> bool:
    """Whether a process may claim the probe now: open and its wait is over, or half-open
    with a probe whose lease lapsed (its owner died or froze)."""
    if b.state is State.OPEN:
        return b.next_probe_at is None or now >= b.next_probe_at
    return b.state is State.HALF_OPEN and not _held(b, now)


def claim_probe(b: Breaker, now: datetime, me: str, lease: float = PROBE_LEASE) -> Breaker | None:
    """Half-open with ``me`` holding the probe for ``lease`` seconds, if it is due."""
    if not probe_due(b, now):
        return None
    return b._step(
        state=State.HALF_OPEN,
        since=now,
        probe_owner=me,
        probe_until=now + timedelta(seconds=lease),
        reason=f"probing after {b.probe_wait:g}s open",
    )


def probe_passed(b: Breaker, now: datetime, me: str) -> Breaker | None:
    """The probe returned: closed (only its owner's word counts)."""
    if b.state is not State.HALF_OPEN or b.probe_owner != me:
        return None
    return _closed(b, now, "the probe succeeded")


def probe_failed(b: Breaker, now: datetime, me: str, limits: Limits, reason: str) -> Breaker | None:
    """The probe failed with a listed exception: open, the next probe after twice the wait
    (at most ``PROBE_BACKOFF_MAX``)."""
    if b.state is not State.HALF_OPEN or b.probe_owner != me:
        return None
    wait = min(max(b.probe_wait, limits.probe_after) * 2, limits.probe_backoff_max)
    return _opened(b, now, wait, reason, trips=b.trips)


def probe_dropped(b: Breaker, now: datetime, me: str) -> Breaker | None:
    """The owner had nothing to probe with (no delivery came) or stops: open again, the
    next probe after the same wait, claimable by anyone."""
    if b.state is not State.HALF_OPEN or b.probe_owner != me:
        return None
    return _opened(b, now, b.probe_wait, b.reason, trips=b.trips)


def forced(b: Breaker, to: State, now: datetime, limits: Limits, who: str) -> Breaker | None:
    """An operator's "open now" / "close now" (any state; no step if already there)."""
    if to is State.OPEN:
        if b.state is State.OPEN:
            return None
        trips = b.trips + (1 if b.state is State.CLOSED else 0)
        return _opened(b, now, limits.probe_after, f"opened by {who}", trips=trips)
    if to is State.CLOSED:
        return None if b.state is State.CLOSED else _closed(b, now, f"closed by {who}")
    raise ValueError("an operator opens or closes a breaker; half-open is the probe's")


def _closed(b: Breaker, now: datetime, reason: str) -> Breaker:
    return b._step(
        state=State.CLOSED,
        since=now,
        reason=reason,
        probe_wait=0.0,
        next_probe_at=None,
        probe_owner="",
        probe_until=None,
    )


def trip_reason(failures: int, window: float, exc_type: str, detail: str) -> str:
    """Why it tripped, for the row, the log line and the alert."""
    return f"{failures} failure(s) in {window:g}s, the last {exc_type}: {detail}"[:500]
