"""The consumer loop behind ``manage.py rmq_consume``.

One pika ``BlockingConnection`` owned by the main thread; receivers run in worker threads
so a slow receiver never starves heartbeats. A worker turns a delivery into an *action*
(ack, publish-a-retry-then-ack, release) and hands it back to the connection's thread with
``add_callback_threadsafe``. A worker only describes a row to park; the parking thread
(``park_writer``) commits rows in batches and the ack is only requested after the commit; a
retry is only acked after the broker confirmed its copy.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from queue import Empty, SimpleQueue
from typing import Any

import pika.exceptions as pex
from django.db import DatabaseError, close_old_connections, connections

from . import broker, signals, topology
from .conf import app_settings
from .delays import DelayLevels
from .envelope import (
    UNDECODABLE_HEADERS,
    Failure,
    Undecodable,
    decode_body,
    delivery_digest,
    error_summary,
    error_type_name,
    original_route,
    read_attempt,
    read_int_header,
    read_str_header,
    retry_properties,
)
from .errors import BrokerUnavailable, TopologyError
from .fingerprint import fingerprint, frames_of, library_roots
from .message import Message
from .names import Names
from .outcome import Park, ParkReason, RetryLater, decide
from .park_writer import ParkJob, ParkWriter
from .parking import ParkRequest
from .policies import policy_cache
from .threads import start_daemon
from .topics import Receiver

logger = logging.getLogger("django_rmq_retry.consumer")


# Actions: what the connection's thread must do with a finished delivery ------------------
@dataclass(frozen=True)
class Ack:
    kind: str = "handled"  # or "parked": what the stats count it as


@dataclass(frozen=True)
class Release:
    """Give the delivery back to the queue (shutdown while it could not be parked)."""


@dataclass(frozen=True)
class PublishRetry:
    exchange: str
    routing_key: str
    body: bytes
    properties: dict[str, Any]
    log_line: str
    signal_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StorePark:
    """Hand the row to the parking thread; ack once it is committed."""

    request: ParkRequest
    start_key: str | None
    log_line: str


Action = Ack | Release | PublishRetry | StorePark


@dataclass(frozen=True)
class Delivery:
    generation: int
    tag: int
    queue: str
    receiver: Receiver | None  # None: the orphans queue
    exchange: str
    routing_key: str
    redelivered: bool
    properties: dict[str, Any]
    body: bytes


@dataclass
class Stats:
    handled: int = 0
    retried: int = 0
    parked: int = 0
    released: int = 0
    failed_publishes: int = 0
    reconnects: int = 0

    @property
    def done(self) -> int:
        return self.handled + self.retried + self.parked


def _utc_from_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


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
    ) -> None:
        self.receivers = list(receivers)
        self.names = topology.current_names()
        self.levels: DelayLevels = topology.current_levels()
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
        self._connection: Any = None
        self._channel: Any = None
        self._copies: broker.ConfirmChannel | None = None
        self._unsettled: set[int] = set()
        self._done: SimpleQueue[_Job] = SimpleQueue()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        self._consumer_tags: list[str] = []
        self._inflight: dict[int, _Job] = {}
        self._last_activity = time.monotonic()
        self._pool = _DaemonPool(self.threads, "rmq-receiver", self._process, self._hand_back)
        self._parker = ParkWriter(
            self.names,
            on_done=self._park_done,
            on_stored=self._forget_starts,
            is_current=lambda d: d.generation == self._generation,
            stop=self._stop,
        )
        self._roots = library_roots()
        self._rng = random.Random()
        self._by_queue = {r.queue_name(self.names.prefix): r for r in self.receivers}
        self._broker_counts = str(app_settings.QUEUE_TYPE) == "quorum"

    # Public control -------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Warm stop: safe to call from a signal handler (sets a flag, touches nothing else)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> Stats:
        delay = 0.5
        cap = float(app_settings.RECONNECT_MAX_DELAY)
        first = True
        try:
            while not self._stop.is_set():
                try:
                    self._connect_and_declare()
                    delay = 0.5  # consuming again: the backoff starts over
                    first = False
                    self._consume_until_stopped()
                    break
                except TopologyError:
                    raise
                except BrokerUnavailable as exc:
                    if first and self.fail_fast:
                        raise
                    if first and ("refused the login" in str(exc) or "denied access" in str(exc)):
                        raise
                    logger.error("%s; retrying in %.1fs", exc, delay)
                except broker.CONNECTION_ERRORS as exc:
                    logger.error(
                        "connection to RabbitMQ lost (%s); reconnecting in %.1fs",
                        broker.describe(exc),
                        delay,
                    )
                self._abandon_connection()
                self.stats.reconnects += 1
                self._sleep(delay)
                delay = min(cap, delay * 2)
        finally:
            self._close()
        return self.stats

    # Connection lifecycle -------------------------------------------------------------------
    def _connect_and_declare(self) -> None:
        self._generation += 1
        self._unsettled = set()  # delivery tags start over on a new channel
        with self._wake_lock:
            self._wake_pending = False  # a wake-up scheduled on the old connection is gone
        self._connection = broker.connect(
            name=f"django-rmq-retry consumer {self.names.prefix} pid {os.getpid()}"
        )
        channel = self._connection.channel()
        topology.declare(channel, topology.plan(self.receivers, self.names, self.levels))
        channel.basic_qos(prefetch_count=self.prefetch)
        self._copies = broker.ConfirmChannel(self._connection)
        self._channel = channel
        self._consumer_tags = []
        queues = list(self._by_queue)
        if self.consume_orphans:
            queues.append(self.names.orphan_queue)
        for queue_name in queues:
            consumer_tag = channel.basic_consume(
                queue_name, self._make_callback(queue_name, self._generation)
            )
            self._consumer_tags.append(consumer_tag)
        logger.info(
            "consuming %d queue(s) on %s (prefetch %d, %d thread(s))",
            len(queues),
            broker.mask_url(app_settings.BROKER_URL),
            self.prefetch,
            self.threads,
        )

    def _abandon_connection(self) -> None:
        """Forget a dead connection; unacked deliveries return to their queues by themselves."""
        self._generation += 1
        for job in list(self._inflight.values()):
            self._pool.cancel(job)
        self._inflight.clear()
        conn, self._connection = self._connection, None
        self._channel = self._copies = None
        if conn is not None:
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                logger.debug("closing a broken connection failed", exc_info=True)

    def _close(self) -> None:
        self._pool.shutdown()
        self._parker.close()
        if self._connection is not None:
            try:
                if self._connection.is_open:
                    self._connection.close()
            except Exception:
                logger.debug("closing the connection failed", exc_info=True)
        self._connection = None
        connections.close_all()

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _pump(self, seconds: float) -> None:
        self._connection.process_data_events(time_limit=seconds)
        if not self._done.empty():
            # Safety net: a wake-up handed to a connection that died before running it
            # must never leave finished deliveries unsettled (and the prefetch window full).
            self._drain()
        if self._copies is not None and self._copies.broken is not None:
            raise pex.ChannelWrongStateError(
                f"the channel for retry copies closed: {broker.describe(self._copies.broken)}"
            )

    # Main loop ------------------------------------------------------------------------------
    def _consume_until_stopped(self) -> None:
        self._last_activity = time.monotonic()
        while not self._stop.is_set():
            self._pump(0.05 if self._inflight else 0.25)
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
        for consumer_tag in self._consumer_tags:
            try:
                self._channel.basic_cancel(consumer_tag)
            except broker.CONNECTION_ERRORS:
                return
        # Deliveries whose receiver has not started go back to the queue untouched.
        for job in list(self._inflight.values()):
            self._pool.cancel(job)
        deadline = time.monotonic() + self.shutdown_timeout
        while self._inflight and time.monotonic() < deadline:
            self._pump(0.05)
            for delivery_tag, job in list(self._inflight.items()):
                if job.state is _CANCELLED:
                    self._inflight.pop(delivery_tag, None)
        if self._inflight:
            logger.warning(
                "%d receiver(s) still running after %.0fs; their messages will be redelivered",
                len(self._inflight),
                self.shutdown_timeout,
            )
        self._connection.close()
        self._connection = None

    # Deliveries (connection thread) ---------------------------------------------------------
    def _make_callback(self, queue_name: str, generation: int) -> Callable[..., None]:
        receiver = self._by_queue.get(queue_name)

        def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            tag = method.delivery_tag
            self._unsettled.add(tag)  # never covered by a multiple ack until settled
            self._last_activity = time.monotonic()
            if self._stop.is_set():
                return  # not acked: goes back to the queue when we close
            if (
                self.max_messages is not None
                and self.stats.done + len(self._inflight) >= self.max_messages
            ):
                return  # a bounded run takes no more than it was asked to
            delivery = Delivery(
                generation=generation,
                tag=tag,
                queue=queue_name,
                receiver=receiver,
                exchange=method.exchange,
                routing_key=method.routing_key,
                redelivered=bool(method.redelivered),
                properties=broker.from_pika(properties),
                body=body,
            )
            job = _Job(delivery)
            self._inflight[tag] = job
            self._pool.submit(job)

        return on_message

    def _hand_back(self, job: _Job) -> None:
        """Worker thread → connection thread, waking the loop once per batch, not per message."""
        if job.state is _CANCELLED:
            return
        delivery = job.delivery
        conn = self._connection
        if conn is None or delivery.generation != self._generation:
            return
        self._done.put(job)
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            conn.add_callback_threadsafe(self._drain)
        except Exception:  # connection already gone: the message will be redelivered
            logger.debug("could not hand back delivery %s", delivery.tag, exc_info=True)

    def _drain(self) -> None:
        """Connection thread: settle every finished delivery.

        Plain acks below the oldest unsettled delivery tag go out as one ``multiple=True``
        ack; a tag still running, waiting for its retry copy's confirm, or skipped at
        shutdown is never covered by it.
        """
        with self._wake_lock:
            self._wake_pending = False
        acks: list[int] = []
        while True:
            try:
                job = self._done.get_nowait()
            except Empty:
                break
            delivery = job.delivery
            if delivery.generation != self._generation:
                continue
            self._last_activity = time.monotonic()
            try:
                action = job.result()
            except BaseException:  # a bug of ours must not stop the loop: give it back
                logger.exception("internal error handling delivery %s; releasing it", delivery.tag)
                action = Release()
            if isinstance(action, Ack):
                self._inflight.pop(delivery.tag, None)
                self._unsettled.discard(delivery.tag)
                acks.append(delivery.tag)
                if action.kind == "parked":
                    self.stats.parked += 1
                else:
                    self.stats.handled += 1
            elif isinstance(action, Release):
                self._inflight.pop(delivery.tag, None)
                self._unsettled.discard(delivery.tag)
                self._channel.basic_nack(delivery.tag, requeue=True)
                self.stats.released += 1
            elif isinstance(action, StorePark):
                # Stays in flight and unsettled until the parking thread reports the commit.
                self._parker.submit(
                    ParkJob(delivery, action.request, action.start_key, action.log_line)
                )
            else:
                self._publish_retry(delivery, action)
        if acks:
            self._ack(acks)

    def _park_done(self, delivery: Delivery, stored: bool) -> None:
        """Parking thread: the row is committed (ack) or could not be (give it back)."""
        job = _Job(delivery)
        job.finish(Ack("parked") if stored else Release(), None)
        self._hand_back(job)

    def _ack(self, tags: list[int]) -> None:
        oldest = min(self._unsettled) if self._unsettled else None
        below = [t for t in tags if oldest is None or t < oldest]
        if below:
            self._channel.basic_ack(max(below), multiple=True)
        for tag in tags:
            if oldest is not None and tag > oldest:
                self._channel.basic_ack(tag)

    def _publish_retry(self, delivery: Delivery, action: PublishRetry) -> None:
        """Publish the retry copy; ack the original only once the broker confirmed the copy.

        The delivery stays in flight (a warm shutdown waits for it) until the confirm.
        """
        generation = self._generation

        def settled(ok: bool, why: str) -> None:
            self._inflight.pop(delivery.tag, None)
            self._unsettled.discard(delivery.tag)
            if generation != self._generation:
                return  # the connection was replaced: the original is redelivered
            if not ok:
                self.stats.failed_publishes += 1
                logger.error(
                    "retry copy of %s was not accepted by the broker (%s); the original "
                    "returns to its queue",
                    delivery.properties.get("message_id"),
                    why,
                )
                self._channel.basic_nack(delivery.tag, requeue=True)
                return
            self._channel.basic_ack(delivery.tag)
            self.stats.retried += 1
            logger.warning(action.log_line)
            for _r, res in signals.message_retried.send_robust(**action.signal_kwargs):
                if isinstance(res, Exception):
                    logger.error("a message_retried signal receiver failed: %r", res)

        def on_settled(acked: bool, returned: bool) -> None:
            # Inside pika's frame callback, which must not re-enter the blocking connection
            # (settled acks on it): run it from a timer on the same loop instead.
            conn.call_later(
                0,
                functools.partial(
                    settled, acked and not returned, broker.settled_reason(acked, returned)
                ),
            )

        assert self._copies is not None  # set with the connection, on this thread
        conn = self._connection
        self._copies.publish(
            action.exchange,
            action.routing_key,
            action.body,
            broker.to_pika(action.properties),
            on_settled,
        )

    # Worker side ---------------------------------------------------------------------------
    def _process(self, d: Delivery) -> Action:
        if d.generation != self._generation:
            return Release()
        close_old_connections()
        try:
            if d.receiver is None:
                return self._park_orphan(d)
            return self._run_receiver(d, d.receiver)
        finally:
            close_old_connections()

    def _run_receiver(self, d: Delivery, rec: Receiver) -> Action:
        headers = d.properties.get("headers") or {}
        attempt, warning = read_attempt(headers, self.names)
        if warning:
            logger.warning("%s: message %s: %s", rec.name, d.properties.get("message_id"), warning)
        exchange, routing_key = original_route(headers, d.exchange, d.routing_key, self.names)
        start_key, over_limit = (
            self._delivery_limit_check(d)
            if d.redelivered or (self._broker_counts and "x-delivery-count" in headers)
            else (None, None)
        )
        if over_limit is not None:
            return self._park(d, rec, attempt, exchange, routing_key, over_limit, None, start_key)
        if UNDECODABLE_HEADERS in headers:
            # pika could not decode the header table (see broker.py): park the body with no
            # headers, so a requeue of the row is an ordinary message, not this marker again.
            reason = f"{headers[UNDECODABLE_HEADERS]}; the headers were dropped"
            d = replace(d, properties={**d.properties, "headers": {}})
            return self._park(
                d,
                rec,
                attempt,
                exchange,
                routing_key,
                Park(ParkReason.UNDECODABLE, reason),
                None,
                start_key,
            )
        try:
            body = decode_body(
                d.body, d.properties.get("content_type"), d.properties.get("content_encoding")
            )
        except Undecodable as exc:
            return self._park(
                d,
                rec,
                attempt,
                exchange,
                routing_key,
                Park(ParkReason.UNDECODABLE, str(exc)),
                None,
                start_key,
            )
        message = Message(
            body=body,
            raw=d.body,
            headers=dict(headers),
            routing_key=routing_key,
            exchange=exchange,
            queue=d.queue,
            receiver=rec.name,
            message_id=d.properties.get("message_id"),
            correlation_id=d.properties.get("correlation_id"),
            content_type=d.properties.get("content_type"),
            timestamp=_timestamp(d.properties.get("timestamp")),
            attempt=attempt,
            redelivered=d.redelivered,
            requeued=read_int_header(headers, self.names.header("requeued")) or 0,
            properties=d.properties,
        )
        try:
            rec.func(message, receiver=rec, topic=rec.topic_for(routing_key))
        except BaseException as exc:  # sys.exit() in a receiver is a failure, not our exit
            self._forget_start(start_key)
            return self._after_failure(d, rec, message, exc)
        self._forget_start(start_key)
        return Ack()

    def _after_failure(
        self, d: Delivery, rec: Receiver, message: Message, exc: BaseException
    ) -> Action:
        policy = policy_cache.for_receiver(rec)
        decision = decide(
            message.attempt, exc, policy, max_delay=self.levels.max_delay_ms / 1000, rng=self._rng
        )
        if isinstance(decision, Park):
            return self._park(
                d, rec, message.attempt, message.exchange, message.routing_key, decision, exc
            )
        assert isinstance(decision, RetryLater)
        now = datetime.now(timezone.utc)
        limit = int(app_settings.ERROR_HEADER_MAX)
        failure = Failure(error_type_name(exc), error_summary(exc, limit), now)
        plan = self.levels.plan(decision.delay * 1000)
        delay_ms = plan.units * self.levels.resolution_ms
        props = retry_properties(
            d.properties,
            names=self.names,
            attempt=decision.next_attempt,
            failure=failure,
            exchange=message.exchange,
            routing_key=message.routing_key,
            target_queue=d.queue,
            due_ms=int(now.timestamp() * 1000) + delay_ms,
        )
        exchange = (
            self.names.delay_exchange(plan.first_level)
            if plan.first_level is not None
            else self.names.deliver_exchange
        )
        log_line = (
            f"retry {rec.name} message {message.message_id} attempt "
            f"{decision.next_attempt}/{policy.max_attempts} in {delay_ms / 1000:.1f}s "
            f"after {failure.error_type}: {failure.error_message}"
        )
        return PublishRetry(
            exchange=exchange,
            routing_key=plan.routing_key,
            body=d.body,
            properties=props,
            log_line=log_line,
            signal_kwargs={
                "sender": rec.name,
                "message": message,
                "attempt": message.attempt,
                "delay": delay_ms / 1000,
                "error": exc,
            },
        )

    # Parking (worker thread) ----------------------------------------------------------------
    def _park(
        self,
        d: Delivery,
        rec: Receiver,
        attempt: int,
        exchange: str,
        routing_key: str,
        decision: Park,
        exc: BaseException | None,
        start_key: str | None = None,
    ) -> Action:
        headers = d.properties.get("headers") or {}
        now = datetime.now(timezone.utc)
        if exc is not None:
            error_type = error_type_name(exc)
            error_message = error_summary(exc, 10_000)
            # lookup_lines=False: source lines are read when formatted, from linecache, with
            # no stat() of every file of the stack first (a tenth of a parked message's cost).
            tb = "".join(
                traceback.TracebackException(
                    type(exc), exc, exc.__traceback__, lookup_lines=False
                ).format()
            )
            fp = fingerprint(error_type, frames_of(exc.__traceback__), self._roots, _base_dir())
        else:
            error_type = decision.reason.value
            error_message = decision.detail
            tb = ""
            fp = f"{decision.reason.value}: {decision.detail.split(':')[0]}"
        req = ParkRequest(
            receiver=rec.name,
            queue=d.queue,
            exchange=exchange,
            routing_key=routing_key,
            body=d.body,
            properties=d.properties,
            reason=decision.reason.value,
            reason_detail=decision.detail,
            attempts=attempt,
            redelivered=d.redelivered,
            error_type=error_type,
            error_message=error_message,
            traceback=tb,
            fingerprint=fp,
            first_failure_at=_utc_from_iso(
                read_str_header(headers, self.names.header("first-failure"))
            )
            or now,
            last_failure_at=now,
        )
        log_line = (
            f"parked {rec.name} message {d.properties.get('message_id')} after {attempt} "
            f"attempt(s): {decision.reason.value} ({error_message[:200]})"
        )
        return StorePark(req, start_key, log_line)

    def _park_orphan(self, d: Delivery) -> Action:
        headers = d.properties.get("headers") or {}
        target = read_str_header(headers, self.names.target_header) or "?"
        exchange, routing_key = original_route(headers, d.exchange, d.routing_key, self.names)
        attempt, _warn = read_attempt(headers, self.names)
        fake = Receiver(
            func=lambda *a, **k: None,
            name=_receiver_for_queue(target, self.names),
            queue_suffix=None,
        )
        decision = Park(
            ParkReason.ORPHANED, f"receiver queue {target!r} did not exist when the message was due"
        )
        d2 = Delivery(
            d.generation,
            d.tag,
            target,
            fake,
            d.exchange,
            d.routing_key,
            d.redelivered,
            d.properties,
            d.body,
        )
        return self._park(d2, fake, attempt, exchange, routing_key, decision, None)

    # Delivery limit (a receiver that kills the process) ------------------------------------
    def _delivery_limit_check(self, d: Delivery) -> tuple[str | None, Park | None]:
        """Count receiver starts of a redelivered message; park it past ``DELIVERY_LIMIT``.

        Every queue type counts *receiver starts* in a table row that lives only while a
        redelivered message is being handled. A quorum queue's ``x-delivery-count`` is not
        enough on its own: it also counts the deliveries that sat unstarted in the prefetch
        window of a consumer that died, so a poison message would take its innocent
        neighbours down with it. It only serves when the database cannot be written.
        """
        limit = int(app_settings.DELIVERY_LIMIT)
        headers = d.properties.get("headers") or {}
        # Only a quorum queue sets x-delivery-count; on a classic queue the header can only
        # come from the publisher, and a forged one must not park a healthy message.
        broker_count = headers.get("x-delivery-count") if self._broker_counts else None
        if not isinstance(broker_count, int) or isinstance(broker_count, bool):
            broker_count = None
        from django.db.models import F

        from .models import DeliveryStart

        key = delivery_digest(
            d.queue,
            d.properties.get("message_id"),
            d.body,
            str(headers.get(self.names.header("attempt"))),
            str(headers.get(self.names.header("requeued"))),
        )
        try:
            row, created = DeliveryStart.objects.get_or_create(
                key=key,
                defaults={
                    "queue": d.queue[:255],
                    "starts": 1,
                    "message_id": str(d.properties.get("message_id") or "")[:255],
                },
            )
            if not created:
                DeliveryStart.objects.filter(pk=row.pk).update(starts=F("starts") + 1)
                row.refresh_from_db()
        except DatabaseError as exc:
            if broker_count is not None and broker_count >= limit:
                return None, Park(
                    ParkReason.DELIVERY_LIMIT,
                    f"delivered {broker_count + 1} times without finishing (limit {limit})",
                )
            logger.warning(
                "cannot record delivery start (%s); running without the delivery limit", exc
            )
            return None, None
        if row.starts >= limit:
            return key, Park(
                ParkReason.DELIVERY_LIMIT,
                f"the consumer died {row.starts} times while handling it (limit {limit})",
            )
        return key, None

    def _forget_start(self, key: str | None) -> None:
        if key:
            self._forget_starts([key])

    @staticmethod
    def _forget_starts(keys: list[str]) -> None:
        """The receivers of these deliveries returned (or they were parked): stop counting."""
        from .models import DeliveryStart

        try:
            DeliveryStart.objects.filter(key__in=keys).delete()
        except DatabaseError:
            logger.debug("could not clear %d delivery start(s)", len(keys), exc_info=True)


_PENDING, _RUNNING, _DONE, _CANCELLED = "pending", "running", "done", "cancelled"


class _Job:
    """One delivery's trip through a worker thread.

    What ``concurrent.futures.Future`` would do, without its per-object ``Condition``
    and callback machinery: nobody waits on a job, the worker hands it back once done.
    """

    __slots__ = ("action", "delivery", "error", "state")

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery
        self.state = _PENDING
        self.action: Action | None = None
        self.error: BaseException | None = None

    def finish(self, action: Action | None, error: BaseException | None) -> None:
        self.action, self.error, self.state = action, error, _DONE

    def result(self) -> Action:
        if self.error is not None:
            raise self.error
        assert self.action is not None
        return self.action


class _DaemonPool:
    """A fixed pool of *daemon* receiver threads: ``run(delivery)``, then ``done(job)``.

    ``ThreadPoolExecutor`` threads are joined at interpreter exit, so a receiver still
    running after ``SHUTDOWN_TIMEOUT`` held the process until it returned (scenario 5 of the
    fault suite: timeout 2 s, exit after 8 s). Daemon threads let the process exit on time;
    the abandoned deliveries were never acked, so the broker redelivers them.
    """

    def __init__(
        self,
        workers: int,
        name: str,
        run: Callable[[Delivery], Action],
        done: Callable[[_Job], None],
    ) -> None:
        self._run = run
        self._done = done
        self._lock = threading.Lock()  # job state changes: start vs cancel
        self._queue: SimpleQueue[_Job | None] = SimpleQueue()
        self._threads = [start_daemon(self._loop, f"{name}_{i}") for i in range(max(1, workers))]

    def submit(self, job: _Job) -> None:
        self._queue.put(job)

    def cancel(self, job: _Job) -> bool:
        """Cancel a job no worker has started (it goes back to the queue untouched)."""
        with self._lock:
            if job.state is _PENDING:
                job.state = _CANCELLED
                return True
            return False

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                if job.state is not _PENDING:
                    continue
                job.state = _RUNNING
            try:
                job.finish(self._run(job.delivery), None)
            except BaseException as exc:
                job.finish(None, exc)
            self._done(job)

    def shutdown(self) -> None:
        """Cancel queued jobs and let every thread exit after its current one."""
        while True:
            try:
                job = self._queue.get_nowait()
            except Empty:
                break
            if job is not None:
                self.cancel(job)
        for _ in self._threads:
            self._queue.put(None)


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def _receiver_for_queue(queue: str, names: Names) -> str:
    prefix = names.prefix + "."
    return queue[len(prefix) :] if queue.startswith(prefix) else queue


def _base_dir() -> str:
    from django.conf import settings

    return str(getattr(settings, "BASE_DIR", "") or "")
