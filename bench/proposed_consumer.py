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
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from django_rmq_retry.consumer import Ack, Action, Consumer, Delivery, Release

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
