"""Messages the broker dead-lettered into ``p.dead``: where they came from and why. Pure.

With quorum queues every queue a consumer reads dead-letters into ``p.dead`` once the
broker's delivery limit is reached (``topology.QUORUM_DELIVERY_LIMIT``); an operator's
``message-ttl`` or ``max-length`` policy, or a client's ``reject`` without requeue, lands
there too. The consumer parks each one, under the receiver queue it left, with a reason that
says what the broker did. The broker's own ``x-death`` header is the only source: nothing a
publisher could set survives dead-lettering under another name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .outcome import Park, ParkReason

#: What each ``x-death`` reason means, for the parked row's detail.
_WHY = {
    "delivery_limit": "returned to it more times than its delivery limit ({limit}) allows "
    "(restarts or lost connections with it prefetched, or a loop the consumer did not count)",
    "expired": "it expired there (a message-ttl policy on the queue?)",
    "maxlen": "the queue was full (a max-length policy on the queue?)",
    "rejected": "a client rejected it without requeueing",
}


@dataclass(frozen=True)
class Death:
    """The most recent dead-lettering the broker recorded in ``x-death``."""

    queue: str
    reason: str
    exchange: str
    routing_key: str


def last_death(headers: Mapping[str, Any]) -> Death | None:
    """The newest ``x-death`` entry (the broker puts it first), or ``None`` if unreadable."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], Mapping):
        return None
    entry = deaths[0]
    keys = entry.get("routing-keys")
    first_key = keys[0] if isinstance(keys, list) and keys else ""
    queue, reason, exchange = entry.get("queue"), entry.get("reason"), entry.get("exchange")
    if not (isinstance(queue, str) and isinstance(reason, str) and isinstance(exchange, str)):
        return None
    return Death(queue, reason, exchange, first_key if isinstance(first_key, str) else "")


def dead_letter_park(death: Death | None, limit: int) -> Park:
    """Why a message from ``p.dead`` is parked (reason *delivery_limit*: the broker's bound)."""
    if death is None:
        return Park(
            ParkReason.DELIVERY_LIMIT,
            "dead-lettered by the broker without a readable x-death header",
        )
    why = _WHY.get(death.reason, f"dead-lettered with reason {death.reason!r}")
    return Park(
        ParkReason.DELIVERY_LIMIT,
        f"the broker dead-lettered it from queue {death.queue!r}: {why.format(limit=limit)}",
    )
