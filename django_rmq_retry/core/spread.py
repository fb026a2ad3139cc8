"""Which partition queues a consumer process subscribes to first. Pure.

An ordered receiver's partition queues have a single active consumer each
(``x-single-active-consumer``): RabbitMQ makes the first consumer that subscribes the active
one and keeps it until it goes away; it never rebalances. If every process subscribed to
every partition at once, the first process up would be active on all of them and the others
would only stand by: failover, but no parallelism.

So a process that knows its place among its peers (:class:`Share`: index ``i`` of ``n``)
subscribes at once to *its* partitions (``p % n == i``) and to the others only after
:data:`STANDBY_GRACE`, as a standby: peers started together each become active on their own
share, and every partition still has standbys for failover. Only who subscribes first
changes; RabbitMQ still gives each partition to one consumer at a time, so the order per key
is kept exactly as before. A process without an index subscribes to everything at once.

``rmq_consume --processes N`` gives child ``i`` the index ``i/N`` in :data:`ENV`; an
operator running separate commands or hosts may set it too (``0/2`` and ``1/2``); the
supervisor then splits each host's share among its children (:meth:`Share.child`).

Consumer priorities are not used, although newer RabbitMQ releases let a higher-priority
consumer take over a quorum queue's single active consumer: a takeover moves a partition
away from a live consumer (and perhaps back to it later), while the order gate counts on a
partition staying with its active consumer until that consumer's connection goes
(``consumer.ordering_gate``); and RabbitMQ 3.x ignores them for a single active consumer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Seconds a process with an index waits before it subscribes, as a standby, to the
#: partitions of its peers. Long enough for peers started together (``--processes N``:
#: interpreters that import Django and declare the topology at the same time) to subscribe
#: to their own share first; short, because a peer that never comes leaves its share
#: unread for that long at start. A failover does not wait for it: standbys subscribed
#: once it passed, and RabbitMQ switches to one as soon as the active consumer goes.
STANDBY_GRACE = 5.0

#: The environment variable that gives a consumer process its index: ``"i/n"``.
ENV = "DJANGO_RMQ_RETRY_PROCESS"


@dataclass(frozen=True)
class Share:
    """Process ``index`` (from 0) of ``count`` consumer processes of the same receivers."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"a process index must be i/n with 0 <= i < n, got {self}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> Share:
        """``"i/n"`` as a share; ``ValueError`` says what is wrong."""
        index, sep, count = text.strip().partition("/")
        try:
            if not sep:
                raise ValueError
            return cls(int(index), int(count))
        except ValueError:
            raise ValueError(
                f"{ENV} must be 'i/n' (process i of n, counted from 0), got {text!r}"
            ) from None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Share | None:
        """The share ``environ`` gives (``None`` without :data:`ENV` or with it empty)."""
        text = environ.get(ENV, "").strip()
        return cls.parse(text) if text else None

    def child(self, number: int, children: int) -> Share:
        """The share of child ``number`` (from 0) of ``children`` that a process with this
        share runs: hosts given ``h/H``, each running ``n`` children, make ``H * n`` peers."""
        return Share(self.index * children + number, self.count * children)

    def owns(self, partition: int) -> bool:
        """Whether ``partition`` is this process's to subscribe to first."""
        return partition % self.count == self.index


def split(
    queues: Iterable[str], partitions: Mapping[str, int], share: Share | None
) -> tuple[list[str], list[str]]:
    """``queues`` in two lists, in their order: those to consume at once, and the partition
    queues (``partitions``: queue -> its partition) of other processes, to consume as a
    standby after :data:`STANDBY_GRACE`. Without a share, every queue is consumed at once."""
    now: list[str] = []
    later: list[str] = []
    for queue in queues:
        partition = partitions.get(queue)
        if share is None or partition is None or share.owns(partition):
            now.append(queue)
        else:
            later.append(queue)
    return now, later


__all__ = ["ENV", "STANDBY_GRACE", "Share", "split"]
