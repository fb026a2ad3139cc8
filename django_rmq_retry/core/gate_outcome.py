"""What a gate decides before a receiver runs. Pure: standard library only.

The consumer runs a few checks between a delivery and its receiver (``consumer.gates``):
does the body fit its schema, may the receiver run now, is its key held. Each check
answers with one of these values, or ``None`` ("nothing to say: ask the next one"). The
values only describe; the consumer's handler turns them into actions (a row to park, a copy
to publish, a delivery to give back), so a gate never touches a broker or a row.

- :class:`Proceed`: go on, and hand the receiver ``data`` (e.g. the typed instance the body
  was validated into) as ``message.data``.
- :class:`~.outcome.Park`: park the delivery now, at this attempt, never retried.
- :class:`Hold`: keep the message out of the receiver's way for ``delay`` seconds: a copy,
  same attempt, waits in the broker's delay levels and comes back to the same queue (the
  original is acked once the broker confirmed the copy). Nothing is counted.
- :class:`GiveBack`: return the delivery to the head of its queue, unacked, after ``wait``
  seconds, without counting an attempt or a delivery start.
- :class:`Settled`: the gate took the message over and committed what replaces it (per-key
  order sets it aside behind its key's blocker): ack it; the receiver does not run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .delays import ms_rounded_up
from .envelope import Envelope, iso
from .envelope import _copy as copy_of
from .names import Names
from .outcome import Park

#: The shortest wait of a give-back: a gate that gives back every delivery it sees costs
#: the broker at most one redelivery per message and per this many seconds, never a hot loop.
MIN_GIVE_BACK_WAIT = 0.05
#: The shortest hold (a copy through the delay levels: their resolution rounds it up anyway).
MIN_HOLD = 0.1


@dataclass(frozen=True, slots=True)
class Proceed:
    """Go on to the next gate (then the receiver), handing the receiver ``data``."""

    data: Any


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the message away from its receiver ``delay`` seconds, then ask again.

    ``cause`` is logged (e.g. ``"key 'order-7' is held by a retry"``).
    """

    delay: float
    cause: str

    def __post_init__(self) -> None:
        if not self.delay >= MIN_HOLD:  # (also refuses NaN)
            object.__setattr__(self, "delay", MIN_HOLD)


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Return the delivery to its queue after ``wait`` seconds, nothing counted.

    Meant for a consumer that is about to stop taking from that queue (a dependency's
    breaker that opened): the broker keeps the message at the head of its queue.
    """

    cause: str
    wait: float = 1.0

    def __post_init__(self) -> None:
        if not self.wait >= MIN_GIVE_BACK_WAIT:  # (also refuses NaN)
            object.__setattr__(self, "wait", MIN_GIVE_BACK_WAIT)


@dataclass(frozen=True, slots=True)
class Settled:
    """The gate has taken the message over: ack it without running the receiver, nothing
    counted. At-least-once: a gate answers this only once what replaces the delivery is
    committed (a row of its own), so a crash before the ack only delivers it again.

    ``cause`` is logged (e.g. ``"set aside behind message 7 of key 'order-7'"``).
    """

    cause: str


GateOutcome = Proceed | Park | Hold | GiveBack | Settled
"""What a gate may answer (``None`` too: nothing to say)."""


def hold_properties(
    properties: Mapping[str, Any],
    *,
    names: Names,
    envelope: Envelope,
    target_queue: str,
    due_us: int,
) -> dict[str, Any]:
    """Properties of a held message's copy: the same attempt, the route it was first
    published with, the due time and the queue it comes back to (as a retry copy carries
    them, so it comes back the same way), and no failure added: nothing failed."""
    h = names.header
    first = envelope.first_failure
    return copy_of(
        properties,
        names,
        {
            h("attempt"): envelope.attempt,
            h("first-failure"): iso(first) if first is not None else None,
            h("original-exchange"): envelope.exchange,
            h("original-routing-key"): envelope.routing_key,
            h("due"): ms_rounded_up(due_us),
            h("due-us"): due_us,
            names.target_header: target_queue,
        },
    )
