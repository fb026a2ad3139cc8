"""Opt-in (``SPARE_PREFETCH``): a spare consumer widens a queue's window while deliveries
no receiver needs fill it.

By default a consumer process holds at most ``PREFETCH`` unacked deliveries per queue,
whatever waits among them (retry copies in the landing, rows waiting for their parked
commit): the broker's per-consumer prefetch is the bound, and dispatch across consumer
processes stays fair. ``SPARE_PREFETCH`` = N > 0 trades that for throughput in the two
cases below: the bound becomes ``PREFETCH + N`` per queue, held only while such deliveries
wait there.

Two kinds of delivery sit in the window without a receiver: retry copies waiting in the
landing for their due time, and deliveries whose parked row waits for its commit. A flood
of failures parks one window per commit (the parking thread writes whatever accumulated
while its last commit ran); a stream of retries, each held up to the landing's last
stretch, can keep more copies held than one window holds, and then the next copies and
fresh messages alike wait in the queue until a held one runs. A wider window helps both
(bench/README.md: the ``parking`` and ``delay`` scenarios), at the cost of one process
holding more than its share: hence opt-in, with its own bound.

A running consumer's prefetch cannot be raised: RabbitMQ applies a per-consumer
``basic.qos`` only to consumers started after it, and a channel-wide (``global``) prefetch is
a deprecated feature, refused by default since RabbitMQ 4.3 and never offered by quorum
queues. So the consumer (when opted in) starts a second, *spare* consumer on that queue with its own
prefetch, and cancels it once nothing of that queue has been held for a while. The copies
(and any fresh message) it receives are handled exactly like the main consumer's, on the
same channel; cancelling it leaves its unacked deliveries where they are, and pika gives
back to the queue, untouched, any it had not dispatched yet.

This module only decides (pure state, no broker): the consumer's loop asks it on each tick
and does what it says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: Seconds with nothing of its queue held before a spare consumer is cancelled: a stream of
#: retries landing now and then keeps one spare, instead of two RPCs per copy.
SPARE_LINGER_S = 1.0


@dataclass(frozen=True)
class SpareMoves:
    """What the loop should do: start a spare on these queues, cancel these consumer tags."""

    start: tuple[str, ...] = ()
    cancel: tuple[str, ...] = ()


NOTHING = SpareMoves()


@dataclass
class SpareWindows:
    """Which queues have a spare consumer, and when each last had a held copy.

    ``spare_prefetch`` 0 (the default setting): never a spare, the window is ``prefetch``.
    """

    prefetch: int
    spare_prefetch: int = 0
    #: queue → the spare consumer's tag
    tags: dict[str, str] = field(default_factory=dict)
    #: queue → monotonic time its held copies were last seen (only for queues with a spare)
    last_held: dict[str, float] = field(default_factory=dict)

    def threshold(self) -> int:
        """Held copies of one queue that call for a spare: half its window (at least one)."""
        return max(1, self.prefetch // 2)

    def worth_deciding(self, held_in_all: int) -> bool:
        """Cheap test before :meth:`decide`, whose per-queue counts walk the held copies:
        with no spare open and fewer copies held in all than the threshold, no queue can
        reach it; with spares off, nothing ever is."""
        if self.spare_prefetch <= 0:
            return False
        return bool(self.tags) or held_in_all >= self.threshold()

    def decide(self, held: Mapping[str, int], now: float) -> SpareMoves:
        """``held``: deliveries waiting per queue now, in the landing or for their parked
        row's commit (queues absent hold none)."""
        if self.spare_prefetch <= 0 or (not held and not self.tags):
            return NOTHING
        start = tuple(q for q, n in held.items() if n >= self.threshold() and q not in self.tags)
        cancel = []
        for queue, tag in self.tags.items():
            if held.get(queue, 0) > 0:
                self.last_held[queue] = now
            elif now - self.last_held.get(queue, now) >= SPARE_LINGER_S:
                cancel.append(tag)
        if not start and not cancel:
            return NOTHING
        return SpareMoves(start, tuple(cancel))

    def started(self, queue: str, tag: str, now: float) -> None:
        self.tags[queue] = tag
        self.last_held[queue] = now

    def forget(self, tag: str) -> str | None:
        """The spare ``tag`` is cancelled (by us or by the broker): its queue, if it was one."""
        for queue, t in list(self.tags.items()):
            if t == tag:
                del self.tags[queue]
                self.last_held.pop(queue, None)
                return queue
        return None

    def reset(self) -> None:
        """A new connection: the old channel's consumers are gone with it."""
        self.tags.clear()
        self.last_held.clear()
