"""The per-key order gate: "is this key held?" (``core.ordering``, ``parking.holds``).

For a receiver declared with ``ordering_key=``, before it runs: read the message's key and
the key's hold. A free key runs. A key held by another message sets this one aside behind
it (a row, committed, then the delivery is acked: ``Settled``); other keys of the same
partition go on. After the receiver ran (:meth:`OrderingGate.after`): a failure holds the
key behind this message (its retry copy, or its parking, follows); the blocker's success
releases the messages set aside, in order. A message whose key cannot be read is parked
with the reason.

The gate runs on the single receiver thread of a consumer (check E031), and each partition
has one active consumer, so the transitions of one key happen one at a time; the
database's locks cover an operator's discard and a consumer that took over a partition.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from ..core.gate_outcome import GateOutcome, Settled
from ..core.message import Message
from ..core.ordering import Arrival as Verdict
from ..core.ordering import (
    HoldState,
    Incoming,
    OrderingKeyError,
    Step,
    after_attempt,
    held_reason,
    key_from_body,
    message_identity,
    on_arrival,
)
from ..core.outcome import Park, ParkReason
from ..parking import holds
from ..registry import Receiver
from .actions import Delivery
from .gates import Arrival, GateContext

logger = logging.getLogger("django_rmq_retry.ordering")

#: A free key, as the gate knows it without reading the database.
FREE = holds.Found(None, None, False)


@dataclass(frozen=True)
class _Seen:
    """What the check read, for :meth:`OrderingGate.after` (same thread, same delivery)."""

    delivery: Delivery
    key: str
    incoming: Incoming
    found: holds.Found


class OrderingGate:
    """See the module docstring."""

    def __init__(self, context: GateContext) -> None:
        self.names = context.names
        self._held_header = context.names.header(holds.HELD_HEADER)
        self._local = threading.local()
        #: Per partition queue and connection: the keys that may be held (a superset).
        self._held: dict[tuple[str, int], set[str]] = {}
        holds.connect()

    def _maybe_held(self, rec: Receiver, d: Delivery) -> set[str]:
        """The keys of ``d``'s partition that may be held, read from the database on the
        first delivery of that partition on this connection, then kept here.

        Only the partition's active consumer creates holds for its keys (a failure's
        :meth:`after`), and RabbitMQ gives the partition to one consumer at a time, which
        stays active until its connection goes: so on a connection's first delivery from a
        partition this consumer has just become its active one, reads the holds a previous
        one left, and from then on knows every hold of the partition (an operator's
        release only frees keys: a key here that turns out free is dropped on its next
        read). A key not here runs without a read of the database."""
        slot = (d.queue, d.generation)
        keys = self._held.get(slot)
        if keys is None:
            for old in [s for s in self._held if s[0] == d.queue]:
                del self._held[old]
            keys = self._held[slot] = holds.held_keys(rec.name, d.queue)
        return keys

    def uses_database(self, rec: Receiver) -> bool:
        """The holds' rows: only an ordered receiver's deliveries (``gates``)."""
        return rec.ordering_key is not None

    def check(self, arrival: Arrival) -> GateOutcome | None:
        rec = arrival.receiver
        if rec.ordering_key is None:
            return None
        d, env = arrival.delivery, arrival.envelope
        try:
            spec = rec.ordering_key
            # a field: read from the decoded body at once (no Message built per delivery)
            key = key_from_body(arrival.body, spec) if isinstance(spec, str) else None
            key = key if key is not None else rec.key_of(_message(arrival))
        except OrderingKeyError as exc:
            return Park(ParkReason.NON_RETRYABLE, f"no ordering key: {exc}")
        headers = d.properties.get("headers") or {}
        row = headers.get(self._held_header)
        row = row if isinstance(row, int) and not isinstance(row, bool) else None
        ident = message_identity(d.properties.get("message_id"), env.routing_key, d.body)
        maybe_held = self._maybe_held(rec, d)
        if row is None and key not in maybe_held:
            found = FREE  # the usual case: no read of the database at all
        else:
            found = holds.read(rec.name, key, row)
            if found.hold is None:
                maybe_held.discard(key)
        incoming = Incoming(ident, row, found.row_held)
        self._local.seen = _Seen(d, key, incoming, found)
        verdict = on_arrival(found.hold, incoming)
        if verdict is Verdict.RUN:
            return None
        hold = found.hold
        assert hold is not None or verdict is Verdict.DUPLICATE
        if verdict is Verdict.DUPLICATE:
            return Settled(f"ran before (key {key!r}): acked, not run again")
        assert hold is not None and found.pk is not None
        why = held_reason(hold.blocker, key, hold.state)
        if verdict is Verdict.KEEP:
            if hold.state is HoldState.RELEASING and row is not None:
                holds.keep(found.pk, row)
            return Settled(f"waits again in its place: {why}")
        holds.set_aside(
            found.pk,
            body=d.body,
            properties=d.properties,
            exchange=env.exchange,
            routing_key=env.routing_key,
        )
        return Settled(f"set aside: {why}")

    def after(self, d: Delivery, rec: Receiver, error: BaseException | None) -> None:
        """The receiver ran: take, keep or release the key (never changes the action)."""
        if rec.ordering_key is None:
            return None
        seen: _Seen | None = getattr(self._local, "seen", None)
        self._local.seen = None
        if seen is None or seen.delivery is not d:
            return None
        found = seen.found
        step = after_attempt(found.hold, seen.incoming, failed=error is not None)
        # Raises if the database or the broker fails: the delivery is then given back
        # (counted), and its next run takes the step again.
        if step is Step.HOLD:
            holds.take(rec.name, seen.key, d.queue, seen.incoming.message)
            self._maybe_held(rec, d).add(seen.key)
        elif step is Step.BLOCK:
            assert found.pk is not None and seen.incoming.row is not None
            holds.block_on_row(found.pk, seen.incoming.row, seen.incoming.message)
        elif step is Step.ROW_DONE:
            assert found.pk is not None and seen.incoming.row is not None
            holds.row_done(found.pk, seen.incoming.row)
        elif step is Step.RELEASE:
            assert found.pk is not None
            holds.release_next(found.pk)
        return None


def _message(arrival: Arrival) -> Message:
    """The message as the receiver will get it, for its ``ordering_key`` callable."""
    d, env = arrival.delivery, arrival.envelope
    return Message(
        body=arrival.body,
        raw=d.body,
        headers=dict(d.properties.get("headers") or {}),
        routing_key=env.routing_key,
        exchange=env.exchange,
        queue=d.queue,
        receiver=arrival.receiver.name,
        message_id=d.properties.get("message_id"),
        correlation_id=d.properties.get("correlation_id"),
        content_type=d.properties.get("content_type"),
        timestamp=None,
        attempt=env.attempt,
        redelivered=d.redelivered,
        properties=d.properties,
    )


__all__ = ["OrderingGate"]
