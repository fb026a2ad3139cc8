"""The dispatcher: deliveries to the receivers and their outcomes back, whatever carries
the broker I/O.

The engine (``engine.Consumer``, on one asyncio loop) owns the connections and calls in
here from its I/O thread: a delivery becomes a :class:`~.pool.Job` for the receiver
threads (or the async receivers' loop), a finished job comes back through a
:class:`~.pool.HandBack` and is settled (``_drain``): ack, give back, park (through the
parking thread, acked once its row is committed) or publish a retry copy (the engine's
``_publish_retry``; the original is acked once the copy is confirmed, ``settle``). The
consume channel the engine hands over (``_channel``) offers ``consume``, ``cancel``,
``qos``, ``ack``, ``nack`` and ``is_open``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections

from .. import broker
from .. import hooks as _hooks
from ..conf import app_settings, current_levels, current_names, ordering_partitions
from ..core.budget import channel_lost
from ..core.errors import AccessRefused, BrokerUnavailable, ConnectionLost, TopologyError
from ..core.spread import Share
from ..core.topology_plan import receiver_queues
from ..registry import Receiver
from . import aio
from .acks import AckBook
from .actions import Action, Delivery, Release, StorePark
from .delivery_limit import DeliveryLimit
from .dependency_consumers import ChannelConsumers, DependencyConsumers
from .handler import Handler
from .housekeeper import Housekeeper
from .notifier import Notifier
from .overruns import Cancels, Overruns
from .park_writer import ParkWriter
from .pool import CANCELLED, HAND_BACK_SHARE, RUNNING, DaemonPool, HandBack, Job
from .settle import Settler
from .spare import SpareWindows
from .standby import StandbyConsumers

logger = logging.getLogger("django_rmq_retry.consumer")


@dataclass
class Stats:
    handled: int = 0
    retried: int = 0
    parked: int = 0
    released: int = 0
    reconnects: int = 0

    @property
    def done(self) -> int:
        return self.handled + self.retried + self.parked


class Dispatcher(Settler, Cancels, ChannelConsumers, StandbyConsumers):
    """Consume the given receivers' queues until stopped (or a bounded run ends).

    The part of a consumer every engine shares; an engine adds ``run()`` and the broker
    I/O: ``_call_drain`` (wake its I/O thread to run :meth:`_drain`), ``_publish_retry`` and
    ``_close_connections``.
    """

    def __init__(
        self,
        receivers: Sequence[Receiver],
        *,
        prefetch: int | None = None,
        threads: int | None = None,
        max_messages: int | None = None,
        max_idle_time: float | None = None,
        fail_fast: bool = False,
        consume_orphans: bool = True,
        shutdown_timeout: float | None = None,
        relay: bool = True,
        share: Share | None = None,
    ) -> None:
        self.receivers = list(receivers)
        self.names = current_names()
        self.prefetch = int(prefetch or app_settings.PREFETCH)
        self.threads = int(threads or app_settings.THREADS)
        self.max_messages = max_messages
        self.max_idle_time = max_idle_time
        self.fail_fast = fail_fast
        self.consume_orphans = consume_orphans
        self.shutdown_timeout = float(
            shutdown_timeout if shutdown_timeout is not None else app_settings.SHUTDOWN_TIMEOUT
        )
        self.stats = Stats()
        self._stop = threading.Event()
        self._generation = 0
        #: The consumer's connection while connected (the engine's own kind).
        self._connection: Any = None
        self._channel: Any = None  # the consume channel while connected (ack, nack, consume)
        #: The URL of the connection lost last: a reconnect tries the next broker URL first.
        self._lost_url: str | None = None
        self._queue_by_tag: dict[str, str] = {}
        self._cancelled: list[str] = []  # consumer tags the broker cancelled
        #: The consume channel's deliveries not acked yet (``acks``): a new one per channel.
        self._acks = AckBook()
        #: Finished jobs on their way back to this thread, in batches (``pool.HandBack``).
        self._done = HandBack(self.prefetch // HAND_BACK_SHARE, self._call_drain)
        self._inflight: dict[int, Job] = {}
        self._worker_local = threading.local()  # per receiver thread: when it last finished
        self._last_activity = time.monotonic()
        limits = DeliveryLimit(
            self.names,
            int(app_settings.DELIVERY_LIMIT),
            broker_counts=str(app_settings.QUEUE_TYPE) == "quorum",
        )
        self._limits = limits
        #: Messages whose run goes on: a delivery of one never runs beside it (overruns).
        self._overruns = Overruns(
            limits.local_key,
            int(app_settings.DELIVERY_LIMIT),
            timeouts=str(app_settings.QUEUE_TYPE) == "quorum",
        )
        self._notifier = Notifier()
        self.handler = Handler(
            self.names,
            current_levels(),
            limits=limits,
            landing_ms=int(app_settings.DELAY_LANDING_MS),
            encode=_encoded,
        )
        # async def receivers run on an event loop beside the threads (aio): their own, or
        # with ASYNC_ON_IO_LOOP the engine's, which starts them on it (``_async_on_loop``).
        self._pool = aio.with_event_loop(
            DaemonPool(
                self.threads,
                "rmq-receiver",
                self._process,
                self._hand_back_in_batch,
                hold=self.handler.wait_before,
                idle=self._done.idle,
            ),
            self.receivers,
            self.handler,
            self._hand_back,
            concurrency=int(app_settings.ASYNC_CONCURRENCY),
            is_current=lambda d: d.generation == self._generation,
            io_loop=bool(app_settings.ASYNC_ON_IO_LOOP),
        )
        aio_pool = self._pool.aio if isinstance(self._pool, aio.Pools) else None
        #: The async receivers' pool when it runs on the engine's I/O loop, else ``None``.
        self._async_on_loop = aio_pool if aio_pool is not None and aio_pool.io_loop else None
        self._parker = ParkWriter(
            self.names,
            on_batch_done=self._parked,
            on_stored=limits.forget,
            is_current=lambda d: d.generation == self._generation,
            stop=self._stop,
        )
        #: Deliveries of this connection waiting for their parked row's commit, per queue.
        self._parking: Counter[str] = Counter()
        self._parking_lock = threading.Lock()
        #: Spare consumers widening a queue's window while deliveries no receiver needs fill
        #: it: retry copies held in the landing, rows waiting for their commit. Opt-in
        #: (``SPARE_PREFETCH``): by default PREFETCH bounds what a queue's window holds.
        self._spares = SpareWindows(self.prefetch, int(app_settings.SPARE_PREFETCH))
        self._winding_down = False
        partitions = ordering_partitions()  # an ordered receiver reads its partition queues
        self._by_queue = {
            q: r for r in self.receivers for q in receiver_queues(r, self.names.prefix, partitions)
        }
        self._init_standby(share, self.receivers, self.names.prefix, partitions)  # ours first
        #: Queues not consumed while a dependency's breaker is open (``depends_on=``).
        self._breakers = DependencyConsumers(self._by_queue, self.prefetch)
        ordered = [r.name for r in self.receivers if r.ordering_key is not None]
        if ordered and self.threads > 1:  # the system check E031 says it before a start
            raise ImproperlyConfigured(
                f"{ordered[0]} keeps per-key order (ordering_key=): run it with one receiver "
                f"thread, not {self.threads}, and scale with consumer processes."
            )
        self._housekeeping_stop = threading.Event()
        #: The outbox relay and the inbox purge (``None``: ``relay=False``).
        self._housekeeper = Housekeeper(self._housekeeping_stop) if relay else None
        #: Observability (``django_rmq_retry.hooks``); ``None`` when it is off.
        self._hooks = _hooks.current

    # Public control -------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Warm stop: safe to call from a signal handler (sets a flag, touches nothing else)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def running(self) -> int:
        """Receivers running now: what a warm stop waits for (the command's stop notice)."""
        return sum(1 for job in list(self._inflight.values()) if job.state is RUNNING)

    def _connect_failed(self, exc: Exception, first: bool, wait: float) -> None:
        """Connecting, or a connection, failed with ``exc``: raise what ends the run (a
        topology conflict; on the first try, an unreachable broker with ``fail_fast`` or a
        refused login), else say so and forget the connection; the caller waits ``wait``
        seconds and reconnects."""
        if isinstance(exc, TopologyError):
            raise exc
        if isinstance(exc, BrokerUnavailable):
            if first and (self.fail_fast or isinstance(exc, AccessRefused)):
                raise exc
            logger.error("%s; retrying in %.1fs", exc, wait)
        else:
            logger.error("connection to RabbitMQ lost (%s); reconnecting in %.1fs", exc, wait)
        self._abandon_connection(str(exc))
        self.stats.reconnects += 1

    # Connection lifecycle ----------------------------------------------------------------
    def _new_generation(self) -> None:
        """A new connection: what the one before held is forgotten."""
        self._generation += 1
        self._acks = AckBook()  # delivery tags start over on a new channel
        self._overruns.new_channel(self._generation)
        self._spares.reset()
        with self._parking_lock:
            self._parking.clear()  # the old connection's rows are no longer counted
        self._done.reset()  # a wake-up scheduled on the old connection is gone
        self._breakers.reset()

    def _start_consuming(self, channel: Any, plan: Any, url: str) -> None:
        """The consume channel is open: consume every queue of ours on it."""
        channel.qos(self.prefetch)
        channel.on_cancelled(self._broker_cancelled)
        broker.log_features()  # once per process: whether the header guard is on
        self._channel = channel
        self._queue_by_tag = {}
        self._cancelled.clear()
        queues = list(self._by_queue)
        if self.consume_orphans:  # and, with quorum queues, what the broker dead-lettered
            queues.extend(plan.parking_queues)
        queues = self._first_queues(queues)  # other processes' partitions: later (standby)
        for queue_name in queues:
            if self._breakers.consumes_at_start(queue_name):
                self._consume(queue_name)
        logger.info(
            "consuming %d queue(s) on %s (prefetch %d, %d thread(s))",
            len(queues),
            broker.mask_url(url),
            self.prefetch,
            self.threads,
        )

    def _consume(self, queue_name: str) -> None:
        consumer: list[str] = []  # its tag, for its deliveries (known once consume returns)
        tag = self._channel.consume(
            queue_name, self._on_message(queue_name, self._generation, consumer)
        )
        consumer.append(tag)
        self._queue_by_tag[tag] = queue_name

    def _cancelled_queues(self) -> list[str]:
        """The broker cancelled consumers (``basic.cancel``): their queue was deleted, the
        node holding it went away, or (RabbitMQ 4.3, quorum) a delivery overran the queue's
        consumer timeout (``overruns``). The queues to declare again and consume again (none
        while stopping)."""
        tags, self._cancelled[:] = list(self._cancelled), []
        for tag in tags:
            self._spares.forget(tag)  # a spare is not resumed: the next tick decides again
        queues = [self._queue_by_tag.pop(tag) for tag in tags if tag in self._queue_by_tag]
        if not queues or self._stop.is_set():
            return []
        logger.error(
            "RabbitMQ cancelled the consumer of %s (queue deleted, its node went down, or a "
            "delivery overran the queue's consumer timeout); declaring the topology again "
            "and resuming",
            ", ".join(queues),
        )
        return queues

    def _abandon_connection(self, why: str) -> None:
        """Forget a dead connection; unacked deliveries return to their queues by themselves.

        Each one a receiver already started is a give-back: its cause is noted for the
        delivery limit (a channel the broker keeps closing must not loop for ever).
        """
        self._generation += 1
        for job in list(self._inflight.values()):
            if not self._pool.cancel(job):
                self._limits.note(job.delivery, channel_lost(why))
        self._inflight.clear()
        if self._connection is not None:
            self._lost_url = self._connection.url  # the next connection tries another node
        self._close_connections()
        self._channel = None

    def _close(self) -> None:
        self._housekeeping_stop.set()
        self._breakers.stop()
        if self._housekeeper is not None:
            self._housekeeper.join(timeout=self.shutdown_timeout)
        self._pool.shutdown()
        self._parker.close()
        self._notifier.close()
        self._close_connections()
        connections.close_all()

    def _adjust_spares(self) -> None:
        """Start or cancel spare consumers as the landing's held copies call for
        (``consumer/spare.py``). Runs on the consumer's loop, on a tick."""
        if self._stop.is_set() or self._winding_down:
            return
        now = time.monotonic()
        with self._parking_lock:
            waiting = self._parking + Counter(self._pool.held_by_queue())
        moves = self._spares.decide(waiting, now)
        for tag in moves.cancel:
            queue = self._spares.forget(tag)
            logger.debug("cancelling the spare consumer of %s: nothing waits there", queue)
            self._channel.cancel(tag)
        for queue in moves.start:
            logger.debug(
                "deliveries no receiver needs (retry copies held, rows being parked) fill "
                "the window of %s: a spare consumer (prefetch %d)",
                queue,
                self._spares.spare_prefetch,
            )
            # A per-consumer prefetch applies to consumers started after it: set it for the
            # spare alone, then put it back for any consumer resumed later.
            self._channel.qos(self._spares.spare_prefetch)
            tag = self._channel.consume(queue, self._on_message(queue, self._generation))
            self._channel.qos(self.prefetch)
            self._spares.started(queue, tag, now)

    def _check_spares(self) -> None:
        """After the I/O: start or cancel spare consumers if that may be due (``spare``)."""
        with self._parking_lock:
            parking = self._parking.total()
        if self._spares.worth_deciding(self._pool.held + parking):
            self._adjust_spares()

    # Stopping ------------------------------------------------------------------------------
    def _bounded_run_over(self) -> bool:
        """Whether a bounded run (``max_messages``, ``max_idle_time``) is over (logged)."""
        if self.max_messages is not None and self.stats.done >= self.max_messages:
            logger.info("processed %d message(s); stopping (--max-messages)", self.stats.done)
            return True
        if (
            self.max_idle_time is not None
            and not self._inflight
            and time.monotonic() - self._last_activity >= self.max_idle_time
        ):
            logger.info("idle for %.1fs; stopping (--max-idle-time)", self.max_idle_time)
            return True
        return False

    def _begin_warm_shutdown(self) -> bool:
        """Stop consuming; deliveries whose receiver has not started go back to the queue
        untouched. False if the channel is gone (the broker has every delivery back)."""
        self._winding_down = True  # no spare consumer starts from here on
        if self._hooks is not None:
            self._hooks.loop_tick(False)  # stopping: not ready any more
        for consumer_tag in [*self._queue_by_tag, *self._spares.tags.values()]:
            try:
                self._channel.cancel(consumer_tag)
            except ConnectionLost:
                return False
        for job in list(self._inflight.values()):
            self._pool.cancel(job)
        return True

    def _still_waiting(self) -> None:
        """A warm shutdown's turn: alive, not ready; cancelled deliveries are no longer
        waited for."""
        if self._hooks is not None:
            self._hooks.loop_tick(False)
        for delivery_tag, job in list(self._inflight.items()):
            if job.state is CANCELLED:
                self._inflight.pop(delivery_tag, None)

    def _log_unfinished(self) -> None:
        logger.warning(
            "%d receiver(s) still running after %.0fs; their messages will be redelivered",
            len(self._inflight),
            self.shutdown_timeout,
        )

    # Deliveries (connection thread) ---------------------------------------------------------
    def _on_message(
        self, queue_name: str, generation: int, consumer: list[str] | None = None
    ) -> broker.connection.OnMessage:
        receiver = self._by_queue.get(queue_name)

        def on_message(
            tag: int,
            exchange: str,
            routing_key: str,
            redelivered: bool,
            properties: dict[str, Any],
            body: bytes,
        ) -> None:
            if generation != self._generation:
                return  # a closed channel's: the broker has it back already
            self._acks.delivered(tag)  # never covered by a multiple ack until settled
            self._last_activity = time.monotonic()
            if self._stop.is_set():
                return  # not acked: goes back to the queue when we close
            if (
                self.max_messages is not None
                and self.stats.done + len(self._inflight) >= self.max_messages
            ):
                return  # a bounded run takes no more than it was asked to
            job = Job(
                Delivery(
                    queue_name,
                    receiver,
                    exchange,
                    routing_key,
                    redelivered,
                    properties,
                    body,
                    tag,
                    generation,
                )
            )
            self._admit(job, consumer[0] if consumer else "")  # (overruns)

        return on_message

    def _hand_back(self, job: Job) -> None:
        """The event loop of ``async def`` receivers → the consumer's loop: wakes it now."""
        if self._outcome(job):
            self._done.put(job, now=True)

    def _hand_back_in_batch(self, job: Job) -> None:
        """Receiver thread → the consumer's loop, which wakes once per batch (``HandBack``)."""
        if self._outcome(job):
            self._done.put(job)

    def _outcome(self, job: Job) -> bool:
        """Whether the consumer's loop settles ``job``: not if it was cancelled, is of
        a connection gone, or is a row to park (that goes to the parking thread now)."""
        if job.state is CANCELLED:
            return False
        self._run_ended(job)  # deliveries that waited for its run go now (overruns)
        delivery = job.delivery
        if self._connection is None or delivery.generation != self._generation:
            return False
        if isinstance(job.action, StorePark):
            # Straight to the parking thread: the consumer's loop has nothing to do with
            # it until the row is committed. Through it, each parked message would cost one
            # more hand-off and wake-up.
            self._submit_park(delivery, job.action)
            return False
        return True

    # Worker side ---------------------------------------------------------------------------
    def _process(self, d: Delivery) -> Action:
        if d.generation != self._generation:
            return Release()
        # Django's per-request hygiene, as around a request: drop a connection that is broken
        # or past CONN_MAX_AGE. After every delivery; before one only after an idle second
        # (the check after the previous delivery covers a busy stream, and costs little).
        local = self._worker_local
        if time.monotonic() - getattr(local, "finished", 0.0) > 1.0:
            close_old_connections()
        try:
            return self.handler.handle(d)
        finally:
            close_old_connections()
            local.finished = time.monotonic()

    # The engine's part ---------------------------------------------------------------------
    def _call_drain(self) -> None:
        """Any thread: run :meth:`_drain` on the I/O thread."""
        raise NotImplementedError

    def _close_connections(self) -> None:
        """Close the engine's connections (never raises)."""
        raise NotImplementedError


def _encoded(properties: Any) -> broker.Encoded:
    """A copy's properties as its content-header frame carries them (measured, then sent)."""
    return broker.Encoded(broker.encode_properties(properties), properties.get("message_id"))


def _log_blocked(which: str, blocked: bool, reason: str) -> None:
    """A memory or disk alarm blocked (or released) a connection's publishes: say so."""
    if blocked:
        logger.warning(
            "RabbitMQ blocked the %s connection (%s): a memory or disk alarm; its publishes "
            "wait until it clears",
            which,
            reason or "no reason given",
        )
    else:
        logger.warning("RabbitMQ unblocked the %s connection", which)
