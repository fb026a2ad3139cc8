"""The consumer loop behind ``manage.py rmq_consume``: the connection's thread.

Two connections owned by the thread that calls :meth:`Consumer.run`: one consumes and
settles, the other only publishes retry copies, so a memory or disk alarm (the broker blocks
connections that publish) holds up the copies but never the acks. Receivers run in worker
threads (``pool``) so a slow receiver never starves heartbeats. A worker turns a delivery
into an *action* (``handler``) and hands it back to the connection's thread, which settles
it: ack, give back, or publish a retry copy and ack the original only once the broker
confirmed the copy. A row to park goes from the worker straight to the parking thread
(``park_writer``); the connection's thread acks the delivery once the row is committed.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections, connections

from .. import broker
from .. import hooks as _hooks
from ..conf import app_settings, current_levels, current_names, current_plan
from ..core.backoff import CappedBackoff
from ..core.budget import channel_lost, copy_refused
from ..core.errors import (
    AccessRefused,
    BrokerUnavailable,
    ConnectionLost,
    MessageRefused,
    TopologyError,
)
from ..core.logfields import attempt_of, fields
from ..registry import Receiver
from . import aio
from .acks import AckBook
from .actions import Ack, Action, Delivery, PublishRetry, Release, StorePark
from .delivery_limit import DeliveryLimit
from .handler import Handler
from .housekeeper import Housekeeper
from .notifier import Notifier
from .park_writer import ParkJob, ParkWriter
from .pool import CANCELLED, HAND_BACK_SHARE, RUNNING, DaemonPool, HandBack, Job
from .spare import SpareWindows

logger = logging.getLogger("django_rmq_retry.consumer")

#: A retry copy's confirm callback: ``(acked, returned)``.
_OnSettled = Callable[[bool, bool], None]
#: Seconds a retry copy published again alone (to find one the broker refuses) waits for
#: its confirm before the broker counts as gone (the confirm pipeline's stall timeout).
COPY_CONFIRM_WAIT = 30.0


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


class Consumer:
    """Consume the given receivers' queues until stopped (or a bounded run ends)."""

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
        self._connection: broker.Connection | None = None
        #: The URL of the connection lost last: a reconnect tries the next broker URL first.
        self._lost_url: str | None = None
        self._channel: Any = None  # broker.Channel while connected
        self._copies_connection: broker.Connection | None = None
        self._copies: broker.ConfirmChannel | None = None
        #: Retry copies published and not yet answered, in publish order, by the original's
        #: delivery tag: what to publish again one by one if the broker refuses one of them.
        self._copies_waiting: dict[int, tuple[Delivery, PublishRetry, _OnSettled]] = {}
        self._copies_due = 0.0  # when the copies' connection is pumped next without a copy
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
        self._notifier = Notifier()
        self.handler = Handler(
            self.names,
            current_levels(),
            limits=limits,
            landing_ms=int(app_settings.DELAY_LANDING_MS),
            encode=_encoded,
        )
        # async def receivers run on an event loop of their own beside the threads (aio).
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
        )
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
        self._by_queue = {r.queue_name(self.names.prefix): r for r in self.receivers}
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

    def run(self) -> Stats:
        backoff = CappedBackoff(0.5, float(app_settings.RECONNECT_MAX_DELAY))
        first = True
        if self._housekeeper is not None:
            self._housekeeper.start()
        try:
            while not self._stop.is_set():
                try:
                    self._connect_and_declare()
                    backoff.reset()  # consuming again: the backoff starts over
                    first = False
                    self._consume_until_stopped()
                    break
                except TopologyError:
                    raise
                except BrokerUnavailable as exc:
                    if first and (self.fail_fast or isinstance(exc, AccessRefused)):
                        raise
                    logger.error("%s; retrying in %.1fs", exc, backoff.current)
                    self._abandon_connection(str(exc))
                except ConnectionLost as exc:
                    logger.error(
                        "connection to RabbitMQ lost (%s); reconnecting in %.1fs",
                        exc,
                        backoff.current,
                    )
                    self._abandon_connection(str(exc))
                self.stats.reconnects += 1
                self._wait_to_reconnect(backoff.next())
        finally:
            self._close()
        return self.stats

    def _wait_to_reconnect(self, seconds: float) -> None:
        hooks = self._hooks
        if hooks is None:
            self._stop.wait(seconds)
            return
        hooks.reconnecting()
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            hooks.loop_tick(False)  # alive (waiting on purpose), not ready
            self._stop.wait(min(left, 1.0))

    # Connection lifecycle -------------------------------------------------------------------
    def _connect_and_declare(self) -> None:
        self._generation += 1
        self._acks = AckBook()  # delivery tags start over on a new channel
        self._spares.reset()
        with self._parking_lock:
            self._parking.clear()  # the old connection's rows are no longer counted
        self._done.reset()  # a wake-up scheduled on the old connection is gone
        name = f"django-rmq-retry consumer {self.names.prefix} pid {os.getpid()}"
        self._connection = broker.connect(after=self._lost_url, name=name)
        self._connection.on_blocked(functools.partial(_log_blocked, "consumer"))
        channel = self._connection.channel()
        plan = current_plan(self.receivers, self.names)
        channel.declare(plan)
        channel.qos(self.prefetch)
        channel.on_cancelled(self._cancelled.append)
        self._copies_waiting.clear()
        self._open_copies()
        broker.log_features()  # once per process: which of pika's internals we could use
        self._channel = channel
        self._queue_by_tag = {}
        self._cancelled.clear()
        queues = list(self._by_queue)
        if self.consume_orphans:  # and, with quorum queues, what the broker dead-lettered
            queues.extend(plan.parking_queues)
        for queue_name in queues:
            self._consume(queue_name)
        logger.info(
            "consuming %d queue(s) on %s (prefetch %d, %d thread(s))",
            len(queues),
            broker.mask_url(self._connection.url),
            self.prefetch,
            self.threads,
        )

    def _consume(self, queue_name: str) -> None:
        tag = self._channel.consume(queue_name, self._on_message(queue_name, self._generation))
        self._queue_by_tag[tag] = queue_name

    def _resume_cancelled(self) -> None:
        """The broker cancelled consumers (``basic.cancel``): their queue was deleted, or the
        node holding it went away. Declare the topology again and consume them again; a
        queue that cannot be declared raises (reconnect, or exit if it conflicts)."""
        tags, self._cancelled[:] = list(self._cancelled), []
        for tag in tags:
            self._spares.forget(tag)  # a spare is not resumed: the next pump decides again
        queues = [self._queue_by_tag.pop(tag) for tag in tags if tag in self._queue_by_tag]
        if not queues or self._stop.is_set():
            return
        logger.error(
            "RabbitMQ cancelled the consumer of %s (queue deleted, or its node went down); "
            "declaring the topology again and resuming",
            ", ".join(queues),
        )
        self._channel.declare(current_plan(self.receivers, self.names))
        for queue_name in queues:
            self._consume(queue_name)

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
        self._channel = self._copies = None

    def _close_connections(self) -> None:
        for conn in (self._connection, self._copies_connection):
            if conn is not None:
                conn.close()
        self._connection = self._copies_connection = None

    def _close(self) -> None:
        self._housekeeping_stop.set()
        if self._housekeeper is not None:
            self._housekeeper.join(timeout=self.shutdown_timeout)
        self._pool.shutdown()
        self._parker.close()
        self._notifier.close()
        self._close_connections()
        connections.close_all()

    def _open_copies(self) -> None:
        """A confirm channel for retry copies, on a connection of their own (reconnected if
        the broker closed it over one copy: the consumer's connection stays)."""
        assert self._connection is not None
        if self._copies_connection is None or not self._copies_connection.is_open:
            if self._copies_connection is not None:
                self._copies_connection.close()
            name = f"django-rmq-retry consumer {self.names.prefix} pid {os.getpid()}"
            # No blocked-connection timeout: during an alarm the copies wait as long as it
            # lasts (their originals stay unacked, not given back) while acks flow on the other.
            self._copies_connection = broker.connect(
                self._connection.url, name=f"{name} retry copies", blocked_connection_timeout=None
            )
            self._copies_connection.on_blocked(functools.partial(_log_blocked, "retry-copies"))
            # Retry copies are fitted to the frame limit of the connection that publishes them.
            self.handler.frame_max = self._copies_connection.frame_max
        self._copies = broker.ConfirmChannel(self._copies_connection)

    def _pump(self, seconds: float) -> None:
        assert self._connection is not None and self._copies_connection is not None
        try:
            if self._copies is not None and self._copies.pending:
                # A copy awaits its confirm, which arrives on the other connection: wait on
                # both (waiting on this one alone would hold every confirm up to ``seconds``,
                # and a retry stream would move one prefetch window per pump).
                self._connection.pump_with(self._copies_connection, seconds)
                self._copies_due = time.monotonic() + 1.0
            else:
                self._connection.pump(seconds)
                # Without a copy in flight the copies' connection is pumped for its heartbeats
                # only, once a second: a pump per consumer pump would cost the happy path a
                # poll and pika's event dispatch per delivery batch, a measurable share of
                # each message's cost (see bench/README.md).
                now = time.monotonic()
                if now >= self._copies_due:
                    self._copies_due = now + 1.0
                    self._copies_connection.pump(0)
        except ConnectionLost:
            # The broker closed the copies' connection over one copy (a frame error): no
            # outage, and the consumer's own connection is fine (found below).
            if not (self._connection.is_open and self._copies_refused()):
                raise
        if self._done:
            # Safety net: a wake-up handed to a connection that died before running it
            # must never leave finished deliveries unsettled (and the prefetch window full).
            self._drain()
        self._flush_acks()  # retry copies confirmed in this pump settle their originals
        if self._copies is not None and self._copies.broken is not None:
            why = self._copies.refusal
            if why is None:
                raise ConnectionLost(
                    f"the channel for retry copies closed: {self._copies.broken_reason}"
                )
            self._find_refused_copy(why)
        if not self._channel.is_open:  # e.g. consumer_timeout: 406 acknowledgement timed out
            raise ConnectionLost(
                f"RabbitMQ closed the consumer's channel: {self._channel.close_reason}"
            )
        if self._cancelled:
            self._resume_cancelled()
        with self._parking_lock:
            parking = self._parking.total()
        if self._spares.worth_deciding(self._pool.held + parking):
            self._adjust_spares()

    def _adjust_spares(self) -> None:
        """Start or cancel spare consumers as the landing's held copies call for
        (``consumer/spare.py``). Runs on the connection's thread, after a pump."""
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

    # Main loop ------------------------------------------------------------------------------
    def _consume_until_stopped(self) -> None:
        self._last_activity = time.monotonic()
        self._winding_down = False
        hooks = self._hooks
        while not self._stop.is_set():
            self._pump(0.05 if self._inflight else 0.25)
            if hooks is not None:  # consuming every queue (_pump resumes a cancelled one)
                hooks.loop_tick(True)
            if self.max_messages is not None and self.stats.done >= self.max_messages:
                logger.info("processed %d message(s); stopping (--max-messages)", self.stats.done)
                break
            if (
                self.max_idle_time is not None
                and not self._inflight
                and time.monotonic() - self._last_activity >= self.max_idle_time
            ):
                logger.info("idle for %.1fs; stopping (--max-idle-time)", self.max_idle_time)
                break
        self._warm_shutdown()

    def _warm_shutdown(self) -> None:
        """Stop consuming, let in-flight receivers finish and act on them, then return."""
        self._winding_down = True  # no spare consumer starts from here on
        if self._hooks is not None:
            self._hooks.loop_tick(False)  # stopping: not ready any more
        for consumer_tag in [*self._queue_by_tag, *self._spares.tags.values()]:
            try:
                self._channel.cancel(consumer_tag)
            except ConnectionLost:
                return
        # Deliveries whose receiver has not started go back to the queue untouched.
        for job in list(self._inflight.values()):
            self._pool.cancel(job)
        deadline = time.monotonic() + self.shutdown_timeout
        while self._inflight and time.monotonic() < deadline:
            self._pump(0.05)
            if self._hooks is not None:
                self._hooks.loop_tick(False)
            for delivery_tag, job in list(self._inflight.items()):
                if job.state is CANCELLED:
                    self._inflight.pop(delivery_tag, None)
        if self._inflight:
            logger.warning(
                "%d receiver(s) still running after %.0fs; their messages will be redelivered",
                len(self._inflight),
                self.shutdown_timeout,
            )
        self._close_connections()

    # Deliveries (connection thread) ---------------------------------------------------------
    def _on_message(self, queue_name: str, generation: int) -> broker.connection.OnMessage:
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
            self._inflight[tag] = job
            self._pool.submit(job)

        return on_message

    def _hand_back(self, job: Job) -> None:
        """The event loop of ``async def`` receivers → connection thread: wakes it now."""
        if self._outcome(job):
            self._done.put(job, now=True)

    def _hand_back_in_batch(self, job: Job) -> None:
        """Receiver thread → connection thread, which wakes once per batch (``HandBack``)."""
        if self._outcome(job):
            self._done.put(job)

    def _outcome(self, job: Job) -> bool:
        """Whether the connection's thread settles ``job``: not if it was cancelled, is of
        a connection gone, or is a row to park (that goes to the parking thread now)."""
        if job.state is CANCELLED:
            return False
        delivery = job.delivery
        if self._connection is None or delivery.generation != self._generation:
            return False
        if isinstance(job.action, StorePark):
            # Straight to the parking thread: the connection's thread has nothing to do with
            # it until the row is committed. Through it, each parked message would cost one
            # more hand-off and wake-up.
            self._submit_park(delivery, job.action)
            return False
        return True

    def _call_drain(self) -> None:
        """Any thread: run :meth:`_drain` on the connection's thread."""
        conn = self._connection
        if conn is None:
            return
        try:
            conn.call_threadsafe(self._drain)
        except ConnectionLost:  # connection already gone: its deliveries will be redelivered
            logger.debug("could not wake the connection's thread", exc_info=True)

    def _drain(self) -> None:
        """Connection thread: settle every finished delivery.

        The ack book (``acks``) turns what settled into the fewest frames: a tag still
        running, waiting for its retry copy's confirm or its parked row's commit, or skipped
        at shutdown is never covered by a multiple ack.
        """
        settled_keys: list[str | None] = []
        for job in self._done.take():
            delivery = job.delivery
            if delivery.generation != self._generation:
                continue
            self._last_activity = time.monotonic()
            try:
                action = job.result()
            except BaseException:  # a bug of ours must not stop the loop: give it back
                logger.exception(
                    "internal error handling delivery %s; releasing it",
                    delivery.tag,
                    extra=self._fields(delivery),
                )
                action = Release(cause="an internal error of the consumer")
            if isinstance(action, Ack):
                self._inflight.pop(delivery.tag, None)
                self._acks.ack(delivery.tag)
                settled_keys.append(action.start_key)
                if action.kind == "parked":
                    self.stats.parked += 1
                else:
                    self.stats.handled += 1
                if self._hooks is not None:
                    _settled(
                        self._hooks, delivery, "parked" if action.kind == "parked" else "acked"
                    )
            elif isinstance(action, Release):
                self._inflight.pop(delivery.tag, None)
                self._acks.nack(delivery.tag, requeue=True)
                self._limits.note(delivery, action.cause)
                self.stats.released += 1
                if self._hooks is not None:
                    _settled(self._hooks, delivery, "released")
            elif isinstance(action, StorePark):  # (workers hand these over directly)
                self._submit_park(delivery, action)
            else:
                self._publish_retry(delivery, action)
        self._flush_acks()
        if any(settled_keys):
            self._notifier.submit(functools.partial(self._limits.forget, settled_keys))

    def _submit_park(self, delivery: Delivery, action: StorePark) -> None:
        """Any thread: the parking thread commits the row. The delivery stays in flight and
        unsettled until it reports the commit (:meth:`_parked`). Counted meanwhile: a
        flood of parks fills the window with rows waiting for a commit, and an opt-in
        spare consumer may widen it (``spare.py``)."""
        with self._parking_lock:
            if delivery.generation == self._generation:
                self._parking[delivery.queue] += 1
        self._parker.submit(ParkJob(delivery, action.request, action.start_key, action.log_line))

    def _parked(self, results: list[tuple[Delivery, bool]]) -> None:
        """Parking thread: one commit's rows, stored (ack) or given up (give back), handed
        back with one wake-up. Delivered together, they leave as one multiple ack."""
        with self._parking_lock:
            for delivery, _stored in results:
                if delivery.generation == self._generation and self._parking[delivery.queue] > 0:
                    self._parking[delivery.queue] -= 1
                    if not self._parking[delivery.queue]:
                        del self._parking[delivery.queue]
        jobs: list[Job] = []
        for delivery, stored in results:
            job = Job(delivery)
            job.finish(
                Ack("parked") if stored else Release(cause="its row could not be parked"), None
            )
            if self._outcome(job):
                jobs.append(job)
        self._done.put_batch(jobs)

    def _flush_acks(self) -> None:
        """Connection thread: send what settled since the last flush, nacks first
        (``acks``). A channel the broker closed is left alone: the pump says why, and the
        broker has its deliveries back."""
        if not self._acks.pending or not self._channel.is_open:
            return
        for frame in self._acks.flush():
            if frame.nack:
                self._channel.nack(frame.tag, requeue=frame.requeue)
            else:
                self._channel.ack(frame.tag, multiple=frame.multiple)

    def _publish_retry(self, delivery: Delivery, action: PublishRetry) -> None:
        """Publish the retry copy; ack the original only once the broker confirmed the copy.

        The delivery stays in flight (a warm shutdown waits for it) until the confirm.
        """
        generation = self._generation

        def settled(ok: bool, why: str) -> None:
            if generation != self._generation:
                return  # the connection was replaced: the original is redelivered
            self._copies_waiting.pop(delivery.tag, None)
            self._inflight.pop(delivery.tag, None)
            if not ok:
                logger.error(
                    "retry copy of %s was not accepted by the broker (%s); the original "
                    "returns to its queue",
                    delivery.properties.get("message_id"),
                    why,
                    extra=self._fields(delivery),
                )
                self._limits.note(delivery, copy_refused(why))
                self._acks.nack(delivery.tag, requeue=True)  # sent later in this pump
                if self._hooks is not None:
                    _settled(self._hooks, delivery, "retry_refused")
                return
            self._acks.ack(delivery.tag)  # sent later in this pump
            self.stats.retried += 1
            if self._hooks is not None:
                _settled(self._hooks, delivery, "retried")
            self._notifier.submit(functools.partial(self._after_retry, action))

        def on_settled(acked: bool, returned: bool) -> None:
            # Inside pika's frame callback, which must not re-enter the blocking connection
            # (settled acks on it): run it from a timer on the same loop instead.
            conn.call_later(
                0,
                functools.partial(
                    settled, acked and not returned, broker.settled_reason(acked, returned)
                ),
            )

        assert self._copies is not None and self._connection is not None
        conn = self._connection
        self._copies_waiting[delivery.tag] = (delivery, action, on_settled)
        if self._copies.broken is not None:
            # Closed over a copy before this one: the pump that follows finds that one and
            # publishes this one again with the others waiting (or, an outage, reconnects).
            return
        try:
            self._copies.publish(
                action.exchange, action.routing_key, action.body, _on_wire(action), on_settled
            )
        except MessageRefused as exc:  # known before the broker refuses it: nothing sent
            del self._copies_waiting[delivery.tag]
            self._park_refused(delivery, action, exc.reason)

    def _copies_refused(self) -> bool:
        return self._copies is not None and self._copies.refusal is not None

    def _park_refused(self, delivery: Delivery, action: PublishRetry, why: str) -> None:
        """The broker refuses this retry copy for what it carries: park the original with
        the broker's reason (once its row is committed it is acked), never give it back to
        run its receiver again, never drop the consumer's connection over it."""
        logger.error(
            "retry copy of %s is refused by the broker (%s); parking the original",
            delivery.properties.get("message_id"),
            why,
            extra=self._fields(delivery),
        )
        self._submit_park(delivery, self.handler.park_refused_copy(delivery, why, action.start_key))

    def _find_refused_copy(self, why: str) -> None:
        """The broker closed the copies' channel (or their connection) over what one copy
        carried, and every copy then waiting got no answer. Publish them again one at a
        time, in order, each on a fresh channel: the one refused again is parked with the
        reason, the others are settled as usual (each published once more at most)."""
        waiting = list(self._copies_waiting.items())
        self._copies_waiting.clear()
        logger.warning(
            "RabbitMQ closed the retry copies' channel over one copy (%s); publishing the %d "
            "copies it left without an answer one at a time to find it",
            why,
            len(waiting),
        )
        for tag, (delivery, action, on_settled) in waiting:
            self._open_copies()
            assert self._copies is not None and self._copies_connection is not None
            answered: list[bool] = []

            def note(
                acked: bool,
                returned: bool,
                on_settled: _OnSettled = on_settled,
                answered: list[bool] = answered,
            ) -> None:
                answered.append(True)
                on_settled(acked, returned)

            try:
                self._copies.publish(
                    action.exchange, action.routing_key, action.body, _on_wire(action), note
                )
            except MessageRefused as exc:
                self._park_refused(delivery, action, exc.reason)
                continue
            self._copies_waiting[tag] = (delivery, action, on_settled)
            deadline = time.monotonic() + COPY_CONFIRM_WAIT
            while not answered and self._copies.broken is None:
                if time.monotonic() > deadline:
                    raise ConnectionLost("no confirm from the broker for a retry copy")
                try:
                    self._copies_connection.pump(0.05)
                except ConnectionLost:
                    if not self._copies_refused():
                        raise
            if answered:
                continue
            refusal = self._copies.refusal
            if refusal is None:
                raise ConnectionLost(
                    f"the channel for retry copies closed: {self._copies.broken_reason}"
                )
            self._copies_waiting.pop(tag, None)
            self._park_refused(delivery, action, refusal)
        self._open_copies()  # the last one may have been the culprit

    def _after_retry(self, action: PublishRetry) -> None:
        """Notifier thread: the original is acked; stop counting it, tell the handlers."""
        self._limits.forget([action.start_key])
        action.announce()

    def _fields(self, delivery: Delivery) -> dict[str, Any]:
        """The message fields of a log record about ``delivery`` (``core.logfields``)."""
        rec = delivery.receiver
        headers = delivery.properties.get("headers")
        return fields(
            rec.name if rec is not None else delivery.queue,
            delivery.queue,
            delivery.properties,
            attempt_of(headers, self.names.header("attempt")),
        )

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


def _on_wire(action: PublishRetry) -> Any:
    """A retry copy's properties as the handler encoded them (else as a mapping)."""
    return action.properties if action.wire is None else action.wire


def _encoded(properties: Any) -> broker.Encoded:
    """A copy's properties as its content-header frame carries them (measured, then sent)."""
    return broker.Encoded(broker.encode_properties(properties), properties.get("message_id"))


def _settled(hooks: _hooks.Hooks, delivery: Delivery, outcome: str) -> None:
    rec = delivery.receiver
    hooks.settled(rec.name if rec is not None else delivery.queue, delivery.queue, outcome)


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
