"""Partition queues of other consumer processes, consumed as a standby (``core.spread``).

An ordered receiver's partition queues each have one active consumer: the first to
subscribe. A process that knows its index among its peers (``rmq_consume --processes N``)
consumes its own partitions when its channel opens and the others only once
``STANDBY_GRACE`` passed, so peers started together each become active on their share and
every partition still has standbys. Mixed into ``dispatch.Dispatcher``: it splits the
queues of a new channel (:meth:`StandbyConsumers._first_queues`) and the loop's tick
consumes the rest when due (:meth:`StandbyConsumers._consume_standby`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.names import Names
from ..core.spread import STANDBY_GRACE, Share, split
from ..registry import Receiver

if TYPE_CHECKING:
    from .dependency_consumers import DependencyConsumers

logger = logging.getLogger("django_rmq_retry.consumer")


class StandbyConsumers:
    """See the module docstring. ``share`` is this process's place (``None``: no
    preference, every queue at once)."""

    if TYPE_CHECKING:
        _stop: threading.Event
        _winding_down: bool
        _breakers: DependencyConsumers

        def _consume(self, queue_name: str) -> None: ...

        def tags_of(self, queue: str) -> list[str]: ...

    share: Share | None = None
    #: Each partition queue's partition.
    _partition_of: dict[str, int]
    #: Other processes' partition queues not consumed yet, and from when (monotonic).
    _standby: list[str]
    _standby_at: float = 0.0

    def _init_standby(
        self, share: Share | None, receivers: Sequence[Receiver], prefix: str, partitions: int
    ) -> None:
        self.share = share
        self._partition_of = {
            Names.partition_queue(r.queue_name(prefix), k): k
            for r in receivers
            if r.ordering_key is not None
            for k in range(partitions)
        }
        self._standby = []

    def _first_queues(self, queues: Sequence[str]) -> list[str]:
        """A channel opened: of ``queues``, the ones to consume now; the others' partitions
        wait for the tick after ``STANDBY_GRACE``."""
        now, self._standby = split(queues, self._partition_of, self.share)
        self._standby_at = time.monotonic() + STANDBY_GRACE
        if self._standby:
            logger.info(
                "process %s: consuming its %d partition queue(s) first, the other %d in %gs "
                "as a standby",
                self.share,
                sum(1 for q in now if q in self._partition_of),
                len(self._standby),
                STANDBY_GRACE,
            )
        return now

    def _consume_standby(self) -> None:
        """The loop's tick: once ``STANDBY_GRACE`` passed on this channel, consume the other
        processes' partition queues. A queue a breaker already resumed (``depends_on=``) is
        not consumed twice."""
        if not self._standby or time.monotonic() < self._standby_at:
            return
        if self._stop.is_set() or self._winding_down:
            return
        queues, self._standby = self._standby, []
        for queue_name in queues:
            if not self.tags_of(queue_name) and self._breakers.consumes_at_start(queue_name):
                self._consume(queue_name)
        logger.info("standing by on %d partition queue(s) of other processes", len(queues))


__all__ = ["StandbyConsumers"]
