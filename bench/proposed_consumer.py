"""The consumer hot-path changes proposed in the benchmark report, as a subclass.

Not shipped: ``django_rmq_retry/consumer.py`` belongs to another change. This subclass lets
``manage.py bench_consume`` measure the proposal in the same run as the shipped consumer.
Two changes, no guarantee weakened:

1. **One wake-up per batch.** A worker puts its finished delivery on a queue and calls
   ``add_callback_threadsafe`` only if no wake-up is pending, instead of once per message
   (each call is a syscall plus an I/O-loop wake-up on the connection's thread).
2. **Acks with ``multiple=True``.** The connection's thread drains every finished delivery
   at once; the plain acks below the oldest still-unsettled delivery tag go out as ONE
   ``basic_ack(tag, multiple=True)``. Deliveries not yet settled (running, or skipped during
   a shutdown so that they return to the queue) are never covered by a multiple ack; retries
   and releases keep their own path (publish-confirm-then-ack, nack).
3. **Retry copies with pipelined confirms.** The copy is published on a confirm-mode channel
   without waiting; the original is acked when the broker acks the copy (nacked back to its
   queue if the copy is nacked or returned). The I/O thread no longer sits idle for one
   confirm round trip per failure. The delivery stays in ``_inflight`` until its copy is
   settled, so a warm shutdown still waits for it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from django_rmq_retry import broker, signals
from django_rmq_retry.consumer import Ack, Action, Consumer, Delivery, PublishRetry, Release

logger = logging.getLogger("django_rmq_retry.consumer")


class BatchingConsumer(Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._done: queue.SimpleQueue[tuple[Delivery, Future[Action]]] = queue.SimpleQueue()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        self._unsettled: set[int] = set()

    def _connect_and_declare(self) -> None:
        self._unsettled = set()  # delivery tags start over on a new channel
        super()._connect_and_declare()
        self._copies = AsyncConfirms(self._connection)

    def _finish(self, delivery: Delivery, fut: Future[Action]) -> None:
        try:
            action = fut.result()
        except BaseException:
            action = None
        if not isinstance(action, PublishRetry) or delivery.generation != self._generation:
            super()._finish(delivery, fut)
            return
        generation = self._generation

        def settled(ok: bool, why: str) -> None:
            self._inflight.pop(delivery.tag, None)
            self._unsettled.discard(delivery.tag)
            if generation != self._generation:
                return
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

        self._last_activity = time.monotonic()
        self._copies.publish(
            action.exchange,
            action.routing_key,
            action.body,
            broker.to_pika(action.properties),
            settled,
        )

    def _make_callback(self, queue_name: str, generation: int) -> Any:
        inner = super()._make_callback(queue_name, generation)

        def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            self._unsettled.add(method.delivery_tag)
            inner(channel, method, properties, body)

        return on_message

    def _hand_back(self, delivery: Delivery, fut: Future[Action]) -> None:
        if fut.cancelled():
            return
        conn = self._connection
        if conn is None or delivery.generation != self._generation:
            return
        self._done.put((delivery, fut))
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            conn.add_callback_threadsafe(self._drain)
        except Exception:
            logger.debug("could not hand back delivery %s", delivery.tag, exc_info=True)

    def _drain(self) -> None:
        """Runs on the connection's thread: settle every finished delivery."""
        with self._wake_lock:
            self._wake_pending = False
        acks: list[int] = []
        while True:
            try:
                delivery, fut = self._done.get_nowait()
            except queue.Empty:
                break
            if delivery.generation != self._generation:
                continue
            try:
                action = fut.result()
            except Exception:
                action = Release()
            if isinstance(action, Ack) and action.kind == "handled":
                self._inflight.pop(delivery.tag, None)
                acks.append(delivery.tag)
                continue
            self._finish(delivery, fut)  # parks, retries, releases: unchanged path
            self._unsettled.discard(delivery.tag)
        if not acks:
            return
        self._last_activity = time.monotonic()
        for tag in acks:
            self._unsettled.discard(tag)
        oldest = min(self._unsettled) if self._unsettled else None
        below = [t for t in acks if oldest is None or t < oldest]
        above = [t for t in acks if oldest is not None and t > oldest]
        if below:
            self._channel.basic_ack(max(below), multiple=True)
        for tag in above:
            self._channel.basic_ack(tag)
        self.stats.handled += len(acks)


class AsyncConfirms:
    """A confirm-mode channel whose publishes do not wait: each one gets a callback, called
    (from a safe point of the connection's loop) with ``(ok, reason)`` once the broker acked,
    nacked or returned it."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.impl = connection.channel()._impl
        self.next_tag = 1
        self.pending: dict[int, list[Any]] = {}  # tag -> [callback, returned, message_id]
        self.impl.add_on_return_callback(self._on_return)
        # No wait for confirm.select-ok: pumping the loop here would dispatch deliveries
        # before this object exists. The broker handles the select before any later publish
        # on the channel, so delivery tags still start at 1.
        self.impl.confirm_delivery(ack_nack_callback=self._on_confirm)

    def publish(self, exchange: str, key: str, body: bytes, props: Any, done: Any) -> None:
        tag = self.next_tag
        self.next_tag += 1
        self.pending[tag] = [done, False, props.message_id]
        self.impl.basic_publish(exchange, key, body, props, mandatory=True)

    def _on_return(self, _ch: Any, _method: Any, props: Any, _body: bytes) -> None:
        for entry in self.pending.values():
            if entry[2] == props.message_id and not entry[1]:
                entry[1] = True
                return

    def _on_confirm(self, frame: Any) -> None:
        m = frame.method
        if m.multiple:
            tags = [t for t in self.pending if t <= m.delivery_tag]
        else:
            tags = [m.delivery_tag] if m.delivery_tag in self.pending else []
        acked = m.NAME == "Basic.Ack"
        for t in tags:
            done, returned, _mid = self.pending.pop(t)
            ok = acked and not returned
            why = "" if ok else ("returned as unroutable" if returned else "nacked")
            # Settle from a timer: acking on another channel inside this frame callback
            # would re-enter the blocking connection's I/O loop.
            self.connection.call_later(0, lambda d=done, o=ok, w=why: d(o, w))
