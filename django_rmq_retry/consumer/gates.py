"""The gates: what decides, between a delivery and its receiver, whether the receiver runs.

``Handler.prepare`` first triages a delivery (``core.outcome.triage``: orphaned, over its
delivery limit, undecodable); a delivery that passes goes through the gates, in order,
before its :class:`~.handler.Attempt` is built: schema validation, a dependency's breaker
("may this receiver run now?"), per-key order ("is this key held?"). Each gate lives in a
module of its own; this one only runs them and turns what they say into actions.

**The protocol.** A gate is any object with

    ``check(arrival: Arrival) -> GateOutcome | None``

``arrival`` is the delivery, its receiver, what our headers say (the ``Envelope``), the
decoded body and the data the receiver will get (``message.data``). A gate answers ``None``
(nothing to say: the next gate is asked) or one of the values of ``core.gate_outcome``:

- ``Proceed(data)``: go on, handing the receiver ``data`` (a typed instance);
- ``Park(reason, detail)``: parked now, at this attempt, never retried;
- ``Hold(delay, cause)``: a copy, same attempt, waits ``delay`` seconds in the delay levels
  and comes back to this queue; the original is acked once the broker confirmed the copy
  (at-least-once: a refused copy gives the original back, as for a retry);
- ``GiveBack(cause, wait)``: the delivery returns to the head of its queue, unacked all
  along, ``wait`` seconds later, counting neither an attempt nor a delivery start.

A gate runs on a receiver thread (or a database thread of the async receivers), once per
delivery of every receiver: it returns ``None`` at once for a receiver it has nothing to
say about, and anything it reads from the database it reads cheaply. It never raises for
a bad message (it parks it); a gate that raises is a bug of ours, and the delivery is given
back as any internal error of the consumer is (counted: the delivery limit bounds it).

**Bounds.** A give-back is bounded in rate and in count: the consumer's loop holds the
delivery ``wait`` seconds (at least ``MIN_GIVE_BACK_WAIT``) before it sends the nack, so a
message given back again and again costs the broker one redelivery per ``wait``, never a
hot loop; the delivery stays unacked all along (the prefetch window bounds how many wait),
so a lost connection or a stop only returns it to its queue, never loses it. A gate gives
back only while a state that has a way out holds (a breaker open until its probe): the
gate owns that bound, and should stop the consumer taking from the queue meanwhile. On a
quorum queue every give-back counts in the broker's ``x-delivery-count``: a message given
back past ``QUORUM_DELIVERY_LIMIT`` is dead-lettered and parked (*delivery_limit*), not
lost; a gate that must wait longer holds (``Hold``) instead, which the broker never counts.

**After the receiver.** A gate may also have ``after(delivery, receiver, error)``, asked
once the receiver ran (``error``: what it raised, or ``None``): a ``GiveBack`` there
replaces the ack, retry or park that would follow (the dependency breaker gives back a
failure that trips it, counting no attempt); ``None`` lets them be.

**The database.** A gate may also have ``uses_database(receiver) -> bool``: whether its
``check`` or ``after`` may read or write the database for that receiver's deliveries. The
async receivers' pool runs ``Handler.prepare`` and ``conclude`` on its event loop itself,
with no thread switch, only when no gate may (``consumer.aio``); a gate without the method
is taken to use it (those steps then run on the pool's database threads).

**Registering a gate** is one line in :data:`GATES` (a dotted path to a factory taking the
:class:`GateContext`, e.g. a class); the order of the list is the order they run in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.utils.module_loading import import_string

from ..core.delays import DelayLevels, epoch_us, route
from ..core.envelope import Envelope
from ..core.gate_outcome import GateOutcome, GiveBack, Hold, Proceed, Settled, hold_properties
from ..core.logfields import fields
from ..core.names import Names
from ..core.outcome import Park
from ..registry import Receiver
from .actions import Ack, Action, Delivery, PublishHold, Release, StorePark

logger = logging.getLogger("django_rmq_retry.consumer")

#: The gates every consumer runs, in order: dotted paths to factories of ``GateContext``.
#: Validation comes first (an invalid body is parked before anything counts it).
GATES: list[str] = [
    "django_rmq_retry.consumer.schema_gate.SchemaGate",
    "django_rmq_retry.consumer.dependency_gate.DependencyGate",
    "django_rmq_retry.consumer.ordering_gate.OrderingGate",
]


@dataclass(slots=True)
class Arrival:
    """A delivery on its way to its receiver, as the gates see it."""

    delivery: Delivery
    receiver: Receiver
    envelope: Envelope
    body: Any  # decoded as its content type says
    data: Any = None  # what the receiver gets as ``message.data`` (None: the body)


@dataclass(frozen=True, slots=True)
class GateContext:
    """What a gate is built with: the consumer's names and clock (virtual in tests)."""

    names: Names
    clock: Callable[[], datetime]


class Gate(Protocol):
    """One check before a receiver runs (see the module docstring)."""

    def check(self, arrival: Arrival) -> GateOutcome | None: ...


ParkFn = Callable[..., StorePark]
"""``Handler``'s park: ``(delivery, receiver name, envelope, Park, *, start_key)``."""


class Pipeline:
    """The gates of one handler, and the actions their outcomes become."""

    def __init__(
        self,
        names: Names,
        levels: DelayLevels,
        clock: Callable[[], datetime],
        *,
        landing_ms: int = 0,
        gates: Iterable[Gate] | None = None,
    ) -> None:
        self.names = names
        self.levels = levels
        self.clock = clock
        self.landing_ms = landing_ms
        context = GateContext(names, clock)
        self.gates: Sequence[Gate] = (
            list(gates) if gates is not None else [import_string(p)(context) for p in GATES]
        )
        self._uses_database: dict[int, tuple[Receiver, bool]] = {}

    def run(
        self, d: Delivery, rec: Receiver, env: Envelope, body: Any
    ) -> Arrival | Park | Hold | GiveBack | Settled:
        """Ask each gate in turn: the :class:`Arrival` to run, or the outcome that stops it."""
        arrival = Arrival(d, rec, env, body)
        for gate in self.gates:
            said = gate.check(arrival)
            if said is None:
                continue
            if isinstance(said, Proceed):
                arrival.data = said.data
                continue
            return said
        return arrival

    def uses_database(self, rec: Receiver) -> bool:
        """Whether a gate may use the database for ``rec``'s deliveries (see the module
        docstring); the answer per receiver is kept (gates decide it from the receiver's
        declaration)."""
        known = self._uses_database.get(id(rec))
        if known is None or known[0] is not rec:  # (a receiver registered again: anew)
            said = any(getattr(g, "uses_database", _may)(rec) for g in self.gates)
            known = self._uses_database[id(rec)] = (rec, said)
        return known[1]

    def after(self, d: Delivery, rec: Receiver, error: BaseException | None) -> GiveBack | None:
        """After the receiver ran: a gate with an ``after(delivery, receiver, error)`` method
        (the breaker counts a failure there) may give the delivery back instead of the
        retry, park or ack that would follow; the first that says so wins."""
        for gate in self.gates:
            look = getattr(gate, "after", None)
            said = look(d, rec, error) if look is not None else None
            if said is not None:
                return said
        return None

    def action(
        self,
        outcome: Park | Hold | GiveBack | Settled,
        d: Delivery,
        rec: Receiver,
        env: Envelope,
        start_key: str | None,
        park: ParkFn,
    ) -> Action:
        """The action that carries out a gate's ``outcome`` (``park``: the handler's)."""
        if isinstance(outcome, Park):
            return park(d, rec.name, env, outcome, start_key=start_key)
        extra = fields(rec.name, d.queue, d.properties, env.attempt)
        if isinstance(outcome, Settled):  # the gate committed its own row: ack
            logger.info(
                "%s: message %s: %s",
                rec.name,
                d.properties.get("message_id"),
                outcome.cause,
                extra=extra,
            )
            return Ack(kind="held", start_key=start_key)
        if isinstance(outcome, GiveBack):
            logger.info(
                "%s: message %s goes back to its queue in %.2fs: %s",
                rec.name,
                d.properties.get("message_id"),
                outcome.wait,
                outcome.cause,
                extra=extra,
            )
            return Release(
                cause=outcome.cause, counted=False, wait=outcome.wait, start_key=start_key
            )
        way = route(
            self.levels,
            self.names,
            outcome.delay,
            epoch_us(self.clock()),
            landing_ms=self.landing_ms,
        )
        props = hold_properties(
            d.properties, names=self.names, envelope=env, target_queue=d.queue, due_us=way.due_us
        )
        return PublishHold(
            exchange=way.exchange,
            routing_key=way.routing_key,
            body=d.body,
            properties=props,
            log_line=(
                f"held {rec.name} message {d.properties.get('message_id')} for "
                f"{way.delay_ms / 1000:.1f}s: {outcome.cause}"
            ),
            log_extra=extra,
            start_key=start_key,
        )


def _may(rec: Receiver) -> bool:
    """A gate that does not say whether it uses the database may."""
    return True
