"""The breaker gate: "may this receiver run now?" for receivers with ``depends_on=``.

A process keeps one :class:`BreakerWatch`: the breakers its receivers depend on, read from
their rows (``breakers.state``) at most every :data:`REFRESH` seconds, so a delivery that
runs costs no query of its own. The gate (:class:`DependencyGate`, one line in
``consumer.gates.GATES``) asks it before each delivery of a dependent receiver:

- every breaker closed: nothing to say, the receiver runs;
- one is half-open and this process holds its probe, which no other delivery runs now:
  this delivery is the probe, it runs;
- else (open, or another process probes): given back (``GiveBack``), nothing counted. The
  consumer stops taking from that queue meanwhile (``consumer.dependency_consumers``), so
  only deliveries already in flight come back here.

After the receiver ran (:meth:`DependencyGate.after`), a listed exception counts towards a
trip (``record_failure``, the cluster's count); a failure that trips the breaker, or comes
while it is open, is given back instead of retried: it counts no attempt and parks nothing.
The probe's outcome closes the breaker (it ran, or failed with an exception that is not
listed: the dependency answered) or opens it again with the wait doubled.

**Bounds of the give-back.** A delivery is given back only while its breaker is not closed
(tripping included); while it is open the queue is not consumed, so a message comes back at
most once per trip, plus once per probe it runs as (one per ``PROBE_AFTER`` cluster-wide,
doubling), plus the redeliveries to a process whose watch has not yet seen the trip
(``REFRESH`` seconds at most). On a quorum queue each counts in ``x-delivery-count``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError

from ..breakers import state
from ..conf import dependency_limits
from ..core.breaker import Breaker, Gate, Limits, State, gate, probe_due
from ..core.failure import error_summary, error_type_name
from ..core.gate_outcome import GiveBack
from ..registry import Receiver
from .actions import Delivery
from .gates import Arrival, GateContext

logger = logging.getLogger("django_rmq_retry.breakers")

#: Seconds a process trusts its copy of the breakers' rows.
REFRESH = 0.5
#: Seconds a delivery given back waits before its nack (its queue's consumer stops meanwhile).
GIVE_BACK_WAIT = 1.0
#: Seconds a claimed probe waits for a delivery to run as the probe before it is dropped
#: (nothing waiting in the queue): the next probe is claimable by any process.
PROBE_IDLE = 5.0


@dataclass
class _Probe:
    """This process's probe of one dependency: since when it holds it, and which delivery
    (``id`` of the ``Delivery``) runs as the probe now (0: none yet)."""

    since: datetime
    runner: int = 0


@dataclass
class BreakerWatch:
    """The breakers this process depends on, and the probes it holds (thread-safe)."""

    me: str = field(default_factory=state.me)
    breakers: dict[str, Breaker] = field(default_factory=dict)
    read_at: datetime | None = None
    probes: dict[str, _Probe] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    # Reading ---------------------------------------------------------------------------
    def current(self, names: Iterable[str], now: datetime) -> dict[str, Breaker]:
        """The breakers of ``names``, read again if the copy is older than ``REFRESH``."""
        wanted = list(names)
        with self.lock:
            fresh = (
                self.read_at is not None
                and timedelta(0) <= now - self.read_at < timedelta(seconds=REFRESH)
                and all(n in self.breakers for n in wanted)
            )
            if not fresh:
                self.refresh(wanted, now)
            return {n: self.breakers[n] for n in wanted}

    def refresh(self, names: Iterable[str], now: datetime) -> None:
        """Read the rows of ``names`` (and of every breaker known) now."""
        wanted = list(dict.fromkeys([*self.breakers, *names]))
        try:
            got = state.read_all(wanted)
        except DatabaseError as exc:  # keep the last copy: the database will come back
            logger.warning("cannot read the dependency breakers (%s); using the last copy", exc)
            return
        with self.lock:
            self.breakers.update(got)
            self.read_at = now
            for name, b in got.items():  # a probe this process no longer holds
                if name in self.probes and not (
                    b.state is State.HALF_OPEN and b.probe_owner == self.me
                ):
                    del self.probes[name]

    # The consumer's side (a thread of its own, never the I/O loop) ----------------------
    def tick(self, names: Iterable[str], now: datetime) -> None:
        """Read the rows; claim a probe that is due; drop one that found nothing to run."""
        wanted = list(names)
        self.refresh(wanted, now)
        for name in wanted:
            b = self.breakers.get(name)
            if b is None:
                continue
            held = self.probes.get(name)
            if b.state is not State.CLOSED and probe_due(b, now):
                if state.claim(name, self.me, now=now):
                    with self.lock:
                        self.probes[name] = _Probe(now)
                    self.refresh(wanted, now)
            elif (
                held is not None
                and not held.runner
                and now - held.since > timedelta(seconds=PROBE_IDLE)
            ):
                logger.info("dependency %s: no message to probe with; probing later", name)
                state.drop_probe(name, self.me, now=now)
                with self.lock:
                    self.probes.pop(name, None)
                self.refresh(wanted, now)

    def give_up_probes(self, now: datetime) -> None:
        """This process stops: the probes it holds go back to open (same wait)."""
        with self.lock:
            held, self.probes = list(self.probes), {}
        for name in held:
            state.drop_probe(name, self.me, now=now)

    def mode(self, names: Iterable[str]) -> str:
        """How a queue whose receiver depends on ``names`` is consumed now: ``"on"``,
        ``"probe"`` (one delivery at a time: this process probes) or ``"off"``."""
        with self.lock:
            down = [
                n
                for n in names
                if (b := self.breakers.get(n)) is not None and b.state is not State.CLOSED
            ]
            if not down:
                return "on"
            return "probe" if all(n in self.probes for n in down) else "off"

    # The receivers' side ----------------------------------------------------------------
    def admit(self, delivery: Delivery, names: Iterable[str], now: datetime) -> str | None:
        """``None``: the delivery runs (as the probe of the breakers it took); else why not."""
        breakers = self.current(names, now)
        with self.lock:
            took: list[str] = []
            for name, b in breakers.items():
                verdict = gate(b, now, self.me)
                probe = self.probes.get(name)
                if verdict is Gate.RUN:
                    continue
                if verdict is Gate.PROBE and probe is not None and not probe.runner:
                    probe.runner = id(delivery)
                    took.append(name)
                    continue
                for taken in took:  # not all of them: none of them
                    self.probes[taken].runner = 0
                return f"dependency {name} is {b.state.value.replace('_', '-')} ({b.reason})"
            return None

    def probing(self, delivery: Delivery) -> list[str]:
        """The dependencies ``delivery`` runs as the probe of."""
        with self.lock:
            return [n for n, p in self.probes.items() if p.runner == id(delivery)]

    def settle_probe(self, name: str, error: tuple[str, str] | None, now: datetime) -> Breaker:
        """Write the probe's outcome; this process holds it no more."""
        with self.lock:
            self.probes.pop(name, None)
        after = state.probe_result(name, self.me, error, now=now)
        with self.lock:
            self.breakers[name] = after
        return after

    def failed(self, name: str, error: tuple[str, str], now: datetime) -> Breaker:
        """A listed failure while closed: counted (the trip may follow)."""
        after = state.record_failure(name, *error, now=now)
        with self.lock:
            self.breakers[name] = after
        return after


#: This process's watch (a forked consumer child builds its own: ``me`` names its pid).
_watch: BreakerWatch | None = None
_watch_lock = threading.Lock()


def watch() -> BreakerWatch:
    """This process's :class:`BreakerWatch`."""
    global _watch
    with _watch_lock:
        if _watch is None or _watch.me != state.me():
            _watch = BreakerWatch()
        return _watch


def forget() -> None:
    """Start over with no copy of any breaker (a test's database was rolled back)."""
    global _watch
    with _watch_lock:
        _watch = None


def next_probe(names: Iterable[str]) -> datetime | None:
    """When the first probe of these breakers is due (the in-memory broker jumps there)."""
    w = watch()
    with w.lock:
        times = [
            b.next_probe_at if b.state is State.OPEN else b.probe_until
            for n in names
            if (b := w.breakers.get(n)) is not None and b.state is not State.CLOSED
        ]
    due = [t for t in times if t is not None]
    return min(due) if due else None


class DependencyGate:
    """The gate (see the module docstring); built by ``consumer.gates.Pipeline``."""

    def __init__(self, context: GateContext) -> None:
        self.clock = context.clock
        self._limits: dict[str, Limits] | None = None

    def limits(self) -> dict[str, Limits]:
        if self._limits is None:
            self._limits = dependency_limits()
        return self._limits

    def uses_database(self, rec: Receiver) -> bool:
        """The breakers' rows: only a receiver that ``depends_on`` something (``gates``)."""
        return bool(rec.depends_on)

    def check(self, arrival: Arrival) -> GiveBack | None:
        needs = arrival.receiver.depends_on
        if not needs:
            return None
        why = watch().admit(arrival.delivery, needs, self.clock())
        return None if why is None else GiveBack(why, GIVE_BACK_WAIT)

    def after(
        self, delivery: Delivery, rec: Receiver, error: BaseException | None
    ) -> GiveBack | None:
        """After the receiver ran: count a listed failure, settle a probe; a ``GiveBack``
        for a listed failure while the breaker trips or is open (nothing counted).

        If the database cannot be written, nothing is counted and the delivery follows its
        retry policy (the breaker is a protection, never a new way to lose a message)."""
        if not rec.depends_on:
            return None
        limits = self.limits()
        listed = [
            n
            for n in rec.depends_on
            if error is not None and n in limits and limits[n].listed(error)
        ]
        what = (error_type_name(error), error_summary(error, 500)) if error is not None else None
        try:
            down = _settle(watch(), delivery, listed, what, self.clock())
        except DatabaseError as exc:
            logger.warning("dependency breakers not updated (%s): the retry policy applies", exc)
            return None
        if not (listed and down) or what is None:
            return None
        return GiveBack(
            f"{what[0]} while dependency {', '.join(listed)} is down: back to its queue, "
            "no attempt counted",
            GIVE_BACK_WAIT,
        )


def _settle(
    w: BreakerWatch,
    delivery: Delivery,
    listed: list[str],
    what: tuple[str, str] | None,
    now: datetime,
) -> bool:
    """Write a probe's outcome and count listed failures; whether a breaker of ``listed``
    is not closed now (tripped by this failure, or open already)."""
    down = False
    probes = w.probing(delivery)
    for name in probes:
        # A probe that fails with an exception that is not listed passes: it answered.
        after = w.settle_probe(name, what if name in listed else None, now)
        down = down or after.state is not State.CLOSED
    for name in listed:
        if name in probes or what is None:
            continue
        b = w.current([name], now)[name]
        if b.state is State.CLOSED:
            b = w.failed(name, what, now)
        down = down or b.state is not State.CLOSED
    return down
