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
import time
from collections.abc import Callable
from typing import Any

from .. import broker
from ..conf import app_settings, current_plan
from ..core.backoff import CappedBackoff
from ..core.errors import BrokerUnavailable, ConnectionLost, MessageRefused, TopologyError
from .actions import Delivery, PublishRetry
from .dispatch import Dispatcher, Stats, _log_blocked

logger = logging.getLogger("django_rmq_retry.consumer")

#: A retry copy's confirm callback: ``(acked, returned)``.
_OnSettled = Callable[[bool, bool], None]
#: Seconds a retry copy published again alone (to find one the broker refuses) waits for
#: its confirm before the broker counts as gone (the confirm pipeline's stall timeout).
COPY_CONFIRM_WAIT = 30.0


class Consumer(Dispatcher):
    """Consume the given receivers' queues until stopped (or a bounded run ends)."""

    _connection: broker.Connection | None
    _copies_connection: broker.Connection | None = None
    _copies: broker.ConfirmChannel | None = None
    #: Retry copies published and not yet answered, in publish order, by the original's
    #: delivery tag: what to publish again one by one if the broker refuses one of them
    #: (a new one per connection).
    _copies_waiting: dict[int, tuple[Delivery, PublishRetry, _OnSettled]]
    _copies_due = 0.0  # when the copies' connection is pumped next without a copy

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
                except (BrokerUnavailable, ConnectionLost, TopologyError) as exc:
                    self._connect_failed(exc, first, backoff.current)
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
        self._new_generation()
        name = f"django-rmq-retry consumer {self.names.prefix} pid {os.getpid()}"
        self._connection = broker.connect(after=self._lost_url, name=name)
        self._connection.on_blocked(functools.partial(_log_blocked, "consumer"))
        channel = self._connection.channel()
        plan = current_plan(self.receivers, self.names)
        channel.declare(plan)
        self._copies_waiting = {}
        self._open_copies()
        self._start_consuming(channel, plan, self._connection.url)

    def _resume_cancelled(self) -> None:
        """Declare the topology again and consume the queues whose consumers the broker
        cancelled; a queue that cannot be declared raises (reconnect, or exit)."""
        queues = self._cancelled_queues()
        if queues:
            self._channel.declare(current_plan(self.receivers, self.names))
        for queue_name in queues:
            self._consume(queue_name)

    def _close_connections(self) -> None:
        for conn in (self._connection, self._copies_connection):
            if conn is not None:
                conn.close()
        self._connection = self._copies_connection = None
        self._copies = None

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
        self._check_spares()

    # Main loop ------------------------------------------------------------------------------
    def _consume_until_stopped(self) -> None:
        self._last_activity = time.monotonic()
        self._winding_down = False
        hooks = self._hooks
        while not self._stop.is_set():
            self._pump(0.05 if self._inflight else 0.25)
            if hooks is not None:  # consuming every queue (_pump resumes a cancelled one)
                hooks.loop_tick(True)
            if self._bounded_run_over():
                break
        self._warm_shutdown()

    def _warm_shutdown(self) -> None:
        """Stop consuming, let in-flight receivers finish and act on them, then return."""
        if not self._begin_warm_shutdown():
            return
        deadline = time.monotonic() + self.shutdown_timeout
        while self._inflight and time.monotonic() < deadline:
            self._pump(0.05)
            self._still_waiting()
        if self._inflight:
            self._log_unfinished()
        self._close_connections()

    def _call_drain(self) -> None:
        """Any thread: run :meth:`_drain` on the connection's thread."""
        conn = self._connection
        if conn is None:
            return
        try:
            conn.call_threadsafe(self._drain)
        except ConnectionLost:  # connection already gone: its deliveries will be redelivered
            logger.debug("could not wake the connection's thread", exc_info=True)

    def _publish_retry(self, delivery: Delivery, action: PublishRetry) -> None:
        """Publish the retry copy; ack the original only once the broker confirmed the copy.

        The delivery stays in flight (a warm shutdown waits for it) until the confirm.
        """
        generation = self._generation

        def settled(ok: bool, why: str) -> None:
            if generation != self._generation:
                return  # the connection was replaced: the original is redelivered
            self._copies_waiting.pop(delivery.tag, None)
            self._copy_settled(delivery, action, ok, why)

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


def _on_wire(action: PublishRetry) -> Any:
    """A retry copy's properties as the handler encoded them (else as a mapping)."""
    return action.properties if action.wire is None else action.wire
