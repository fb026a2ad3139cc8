"""Settling: a finished delivery's outcome applied on the consumer's I/O thread.

What the receivers decided (``actions``) becomes frames on the consume channel through the
ack book (``acks``): an ack, a give-back, a row for the parking thread (acked once
committed), or a retry copy the engine publishes (the original is acked once the broker
confirmed the copy). :class:`Settler` is the part of ``dispatch.Dispatcher`` that does it;
its attributes are the dispatcher's.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from .. import hooks as _hooks
from ..core.budget import copy_refused
from ..core.logfields import attempt_of, fields
from ..core.names import Names
from .acks import AckBook
from .actions import Ack, Delivery, PublishRetry, Release, RetryInPlace, StorePark
from .delivery_limit import DeliveryLimit
from .handler import Handler
from .landing import Landing
from .notifier import Notifier
from .park_writer import ParkJob, ParkWriter
from .pool import HandBack, Job

logger = logging.getLogger("django_rmq_retry.consumer")


class Settler:
    """Applies outcomes (see the module docstring); mixed into ``dispatch.Dispatcher``."""

    names: Names
    stats: Any  # dispatch.Stats
    handler: Handler
    _generation: int
    _channel: Any
    _acks: AckBook
    _done: HandBack
    _inflight: dict[int, Job]
    _limits: DeliveryLimit
    _notifier: Notifier
    _parker: ParkWriter
    _parking: Counter[str]
    _parking_lock: threading.Lock
    _hooks: _hooks.Hooks | None
    _last_activity: float
    _stop: threading.Event
    #: Gates' give-backs waiting out their ``wait`` (``_give_back_later``).
    _give_backs: Landing[Job] | None = None

    def _outcome(self, job: Job) -> bool:
        raise NotImplementedError

    def _publish_retry(self, delivery: Delivery, action: PublishRetry) -> None:
        """I/O thread: publish the retry copy; :meth:`_copy_settled` once it is answered,
        :meth:`_park_refused` if the broker refuses it for what it carries."""
        raise NotImplementedError

    def _drain(self) -> None:
        """The consumer's loop: settle every finished delivery.

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
                if action.wait > 0 and not self._stop.is_set():
                    self._give_back_later(job, action)  # a gate's: back here after its wait
                    continue
                self._inflight.pop(delivery.tag, None)
                if isinstance(action, RetryInPlace):  # its quorum queue holds it: a retry
                    self._acks.reject(delivery.tag)
                    settled_keys.append(action.start_key)
                    self.stats.retried += 1
                    self._notifier.submit(action.announce)
                    if self._hooks is not None:
                        _settled(self._hooks, delivery, "retried")
                    continue
                self._acks.nack(delivery.tag, requeue=True)
                if action.counted:
                    self._limits.note(delivery, action.cause)
                else:  # a gate gave it back: no receiver started, nothing to count
                    settled_keys.append(action.start_key)
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

    def _give_back_later(self, job: Job, action: Release) -> None:
        """The consumer's loop: hold a gate's give-back ``action.wait`` seconds (unacked,
        in flight), then hand it back to :meth:`_drain`, which sends the nack. One thread
        for every give-back, started with the first (``landing``); a give-back of a
        connection gone by then is skipped (the broker has it back)."""
        if self._give_backs is None:
            done = self._done
            self._give_backs = Landing(lambda j: done.put(j, now=True), "rmq-give-back")
        job.finish(replace(action, wait=0.0), None)
        self._give_backs.hold(job, time.monotonic() + action.wait, lead=0)

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
        """The consumer's loop: send what settled since the last flush, nacks first
        (``acks``). A channel the broker closed is left alone: its close callback says why,
        and the broker has its deliveries back."""
        if not self._acks.pending or self._channel is None or not self._channel.is_open:
            return
        for frame in self._acks.flush():
            if frame.reject:
                self._channel.reject(frame.tag)
            elif frame.nack:
                self._channel.nack(frame.tag, requeue=frame.requeue)
            else:
                self._channel.ack(frame.tag, multiple=frame.multiple)

    def _copy_settled(self, delivery: Delivery, action: PublishRetry, ok: bool, why: str) -> None:
        """I/O thread: the broker answered the retry copy of ``delivery``: ack the original
        if the copy is stored (``ok``), else give the original back (``why`` says why).
        The frame goes out with the next flush of the ack book."""
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
            self._acks.nack(delivery.tag, requeue=True)
            if self._hooks is not None:
                _settled(self._hooks, delivery, "retry_refused")
            return
        self._acks.ack(delivery.tag)
        self.stats.retried += 1
        if self._hooks is not None:
            _settled(self._hooks, delivery, "retried")
        self._notifier.submit(functools.partial(self._after_retry, action))

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


def _settled(hooks: _hooks.Hooks, delivery: Delivery, outcome: str) -> None:
    rec = delivery.receiver
    hooks.settled(rec.name if rec is not None else delivery.queue, delivery.queue, outcome)
