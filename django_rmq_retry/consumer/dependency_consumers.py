"""Which queues a consumer takes from while dependencies are down.

A receiver with ``depends_on=`` owns a queue that the consumer stops consuming while one of
its breakers is open (the broker keeps its messages; other queues go on), consumes with a
prefetch of 1 while this process holds the probe, and consumes again once it closed,
*ramped*: a prefetch of 1, doubling every :data:`RAMP_STEP` seconds up to ``PREFETCH``, so
a backlog does not hammer a service that has just come back.

Two halves: a thread of its own (:meth:`DependencyConsumers.start`) reads the breakers'
rows and claims a due probe (database work never runs on the I/O loop); the loop's tick
calls :meth:`DependencyConsumers.adjust`, which only compares that in-memory view with
what the channel does and cancels or starts consumers through the dispatcher's
:class:`Consumers` (a per-consumer prefetch applies to the consumers started after it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from django.db import close_old_connections
from django.utils import timezone

from ..registry import Receiver
from .dependency_gate import REFRESH, watch

logger = logging.getLogger("django_rmq_retry.breakers")

#: Seconds between two doublings of a queue's prefetch after its breaker closed.
RAMP_STEP = 1.0


class Consumers(Protocol):
    """What the dispatcher offers: start a consumer of a queue with a prefetch (its tag),
    cancel one, and the tags consuming a queue now."""

    def consume_at(self, queue: str, prefetch: int) -> None: ...

    def cancel_consumer(self, tag: str) -> None: ...

    def tags_of(self, queue: str) -> list[str]: ...


class ChannelConsumers:
    """:class:`Consumers` on the consume channel: mixed into ``dispatch.Dispatcher``, whose
    channel, consumer tags and ``_consume`` it uses."""

    if TYPE_CHECKING:
        _channel: Any
        _queue_by_tag: dict[str, str]
        prefetch: int

        def _consume(self, queue_name: str) -> None: ...

    def consume_at(self, queue: str, prefetch: int) -> None:
        """Consume ``queue`` with a prefetch of its own (the next consumers get PREFETCH)."""
        self._channel.qos(prefetch)
        try:
            self._consume(queue)
        finally:
            self._channel.qos(self.prefetch)

    def cancel_consumer(self, tag: str) -> None:
        """Stop a consumer; the deliveries it took stay ours to settle."""
        self._queue_by_tag.pop(tag, None)
        self._channel.cancel(tag)

    def tags_of(self, queue: str) -> list[str]:
        return [tag for tag, name in self._queue_by_tag.items() if name == queue]


class DependencyConsumers:
    """The dependent queues of one consumer process (see the module docstring)."""

    def __init__(self, by_queue: Mapping[str, Receiver | None], prefetch: int) -> None:
        self.needs = {q: r.depends_on for q, r in by_queue.items() if r and r.depends_on}
        self.names = list(dict.fromkeys(n for needs in self.needs.values() for n in needs))
        self.prefetch = prefetch
        #: What each dependent queue's consumer does now: "on", "probe", "off", or "ramp".
        self._modes: dict[str, str] = {}
        #: Ramping queues: their prefetch now and when it doubles (monotonic seconds).
        self._ramp: dict[str, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __bool__(self) -> bool:
        return bool(self.needs)

    # The watch's thread ----------------------------------------------------------------------
    def start(self) -> None:
        """Read the breakers now (a queue whose breaker is open is not consumed from the
        start), then every ``REFRESH`` seconds on a thread of its own."""
        if self._thread is not None:
            return
        self._look()
        self._thread = threading.Thread(target=self._watch, name="rmq-breakers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a probe this process holds is given up at once (another process
        probes next, without waiting for its lease to lapse)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            try:
                watch().give_up_probes(timezone.now())
            except Exception:  # its lease lapses instead
                logger.warning("could not give up the probes this process holds", exc_info=True)

    def _watch(self) -> None:
        while not self._stop.wait(REFRESH):
            self._look()

    def _look(self) -> None:
        try:
            close_old_connections()
            watch().tick(self.names, timezone.now())
        except Exception:  # a database outage: the last view holds, the next look retries
            logger.warning("cannot read or step the dependency breakers", exc_info=True)

    # The loop's side ------------------------------------------------------------------------
    def consumes_at_start(self, queue: str) -> bool:
        """Whether a new connection consumes ``queue`` at once (the next tick decides the
        rest: a probe, a ramp)."""
        needs = self.needs.get(queue)
        if needs is None:
            return True
        mode = watch().mode(needs)
        self._modes[queue] = "on" if mode == "on" else "off"
        return mode == "on"

    def reset(self) -> None:
        """A new connection: no consumer of ours is left."""
        self._modes.clear()
        self._ramp.clear()

    def adjust(self, consumers: Consumers) -> None:
        """Cancel or start the dependent queues' consumers as their breakers say (the
        loop's tick; no database, no waiting)."""
        now = time.monotonic()
        for queue, needs in self.needs.items():
            want = watch().mode(needs)
            have = self._modes.get(queue, "off")
            if want == "off" and have != "off":
                self._cancel(consumers, queue)
                logger.warning("not consuming %s: dependency %s is down", queue, ", ".join(needs))
                self._modes[queue] = "off"
            elif want == "probe" and have != "probe":
                self._cancel(consumers, queue)
                consumers.consume_at(queue, 1)  # one delivery: the probe
                self._modes[queue] = "probe"
            elif want == "on" and have in ("off", "probe"):
                self._cancel(consumers, queue)
                consumers.consume_at(queue, 1)
                self._modes[queue] = "ramp" if self.prefetch > 1 else "on"
                self._ramp[queue] = (1, now + RAMP_STEP)
                logger.warning(
                    "consuming %s again (dependency %s is back), ramped: prefetch 1, "
                    "doubling every %gs up to %d",
                    queue,
                    ", ".join(needs),
                    RAMP_STEP,
                    self.prefetch,
                )
            elif want == "on" and have == "ramp":
                self._step_ramp(consumers, queue, now)

    def _step_ramp(self, consumers: Consumers, queue: str, now: float) -> None:
        prefetch, due = self._ramp[queue]
        if now < due:
            return
        prefetch = min(prefetch * 2, self.prefetch)
        self._cancel(consumers, queue)  # its deliveries stay ours to settle
        consumers.consume_at(queue, prefetch)
        if prefetch >= self.prefetch:
            self._modes[queue] = "on"
            self._ramp.pop(queue, None)
        else:
            self._ramp[queue] = (prefetch, now + RAMP_STEP)

    @staticmethod
    def _cancel(consumers: Consumers, queue: str) -> None:
        for tag in consumers.tags_of(queue):
            consumers.cancel_consumer(tag)
