"""Publishing with publisher confirms, one connection per process, safe in threads.

``Topic.send`` lands here. A publish returns only once the broker confirmed it; an
unroutable message (no queue bound) raises instead of being silently dropped. A connection
lost mid-publish is replaced and the publish tried once more (at-least-once); a nacked
message is published again after pauses of up to ``PUBLISH_NACK_WAIT`` seconds in all (see
:func:`nack_pauses`).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder

from . import broker
from .batch_stream import Batch, BatchStream
from .conf import app_settings, current_names, current_plan
from .core import bodies
from .core.backoff import pauses_within
from .core.envelope import build_properties
from .core.errors import (
    BrokerUnavailable,
    ChannelClosed,
    ConnectionLost,
    NackedError,
    PublishError,
    TopologyError,
    UnroutableError,
)
from .registry import default_registry

logger = logging.getLogger("django_rmq_retry.publishing")

#: Messages a batch keeps unconfirmed at once (bounds client memory, keeps the pipe full).
BATCH_WINDOW = 1000
#: A connection idle for longer is polled before use, so one the broker closed meanwhile
#: (missed heartbeats, a restart) is replaced quietly instead of failing the publish first.
_IDLE_CHECK_AFTER = 1.0


def nack_pauses() -> tuple[float, ...]:
    """Pauses before publishing a nacked message again, ``PUBLISH_NACK_WAIT`` seconds in all.

    A nack says the broker could not store the message *now*: a quorum queue's leader
    moving while a cluster node stops, a queue process restarting, or a full queue with
    ``overflow=reject-publish``. The first two pass, but not always in seconds: while a node
    stops, its queues' leaders refuse until the node is gone and the others have elected
    new ones. On CI's three-node cluster (two cores, 2026-11-25) the nacks lasted over
    7.5 s, the sum of the fixed pauses used before; on the same kind of host 12.5 s and
    17.5 s while the node took 7 s and 11 s to stop. The last case raises ``NackedError`` once the wait is spent. A message routed to several
    queues may be stored again in those that did take it (same ``message_id``).
    """
    return pauses_within(float(app_settings.PUBLISH_NACK_WAIT))


_pause = time.sleep  # (tests make the pause do something)

#: Bodies become JSON with Django's encoder (dates, decimals, UUIDs).
encode_body = functools.partial(bodies.encode_body, encoder=DjangoJSONEncoder)

_T = TypeVar("_T")

__all__ = [
    "BATCH_WINDOW",
    "PublishResult",
    "Publisher",
    "build_properties",
    "encode_body",
    "nack_pauses",
]


@dataclass(frozen=True)
class PublishResult:
    message_id: str
    exchange: str
    routing_key: str


class Publisher:
    """A lazily opened, confirm-mode channel guarded by a lock. One per process."""

    def __init__(self, url: str | None = None, *, declare: bool | None = None) -> None:
        self._url = url
        #: Declare the whole topology on connecting: ``DECLARE_ON_SEND`` unless given. Off by
        #: default: a publisher needs write permission only (docs/howto/permissions.md).
        self._declare = declare
        self._lock = threading.RLock()
        self._connection: broker.Connection | None = None
        self._channel: broker.Channel | None = None
        #: The pipeline ``publish_many`` pipelines confirms on (opened on first use).
        self._pipeline: broker.Pipeline | None = None
        self._pid = os.getpid()
        #: The URL of the connection dropped last: the next connect tries the next URL first.
        self._dropped_url: str | None = None
        self._last_used = 0.0  # time.monotonic() of the last publish on this connection

    # Connection management ----------------------------------------------------------------
    def _ensure_channel(self) -> broker.Channel:
        if self._pid != os.getpid():  # forked: never share a socket with the parent
            self._connection = self._channel = self._pipeline = None
            self._pid = os.getpid()
        now = time.monotonic()
        if (
            self._connection is not None
            and self._channel is not None
            and self._channel.is_open
            and now - self._last_used > _IDLE_CHECK_AFTER
        ):
            # Only after a pause: in a busy loop every publish already does I/O on this
            # connection (its confirm), and a poll per publish cost a tenth of a send. A
            # connection that dies between two busy publishes fails that publish, which
            # then reconnects and publishes again (the same at-least-once path).
            try:
                self._connection.pump(0)
            except ConnectionLost:
                self._drop()
        self._last_used = now
        if self._channel is None or not self._channel.is_open:
            self._drop()
            self._connection = broker.connect(
                self._url,
                after=self._dropped_url,
                name=f"django-rmq-retry publisher {app_settings.PREFIX} pid {os.getpid()}",
            )
            channel = self._connection.channel()
            channel.confirm_delivery()
            declare = app_settings.DECLARE_ON_SEND if self._declare is None else self._declare
            if declare:
                try:
                    channel.declare(current_plan(default_registry.all()))
                except TopologyError:
                    self._drop()
                    raise
            self._channel = channel
        return self._channel

    def _retire_pipeline(self) -> None:
        pipe, self._pipeline = self._pipeline, None
        if pipe is not None:
            pipe.channel.close()

    def _drop(self) -> None:
        conn, self._connection, self._channel = self._connection, None, None
        self._pipeline = None
        if conn is not None:
            self._dropped_url = conn.url
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _reconnecting(
        self,
        publish: Callable[[], _T],
        give_up: Callable[[ConnectionLost], PublishError | None],
    ) -> _T | None:
        """Run ``publish``; if the connection was lost, reconnect and run it once more.

        After a second loss ``give_up(exc)`` says what to raise (``None``: nothing was left
        unconfirmed after all). A channel the broker closed (no such exchange, ...) is not
        retried: the caller turns ``ChannelClosed`` into its own error.
        """
        for attempt in (1, 2):
            try:
                return publish()
            except BrokerUnavailable as exc:
                raise PublishError(str(exc)) from exc
            except ChannelClosed:
                self._drop()
                raise
            except ConnectionLost as exc:
                self._drop()
                if attempt == 2:
                    error = give_up(exc)
                    if error is None:
                        return None
                    raise error from exc
                logger.warning("publisher connection lost (%s); reconnecting", exc)
        raise AssertionError("unreachable")

    # Publishing ---------------------------------------------------------------------------
    def publish_raw(
        self, exchange: str, routing_key: str, body: bytes, properties: Mapping[str, Any]
    ) -> None:
        """Publish exactly these bytes and properties; return once confirmed."""
        with self._lock:
            try:
                self._send_until_stored(exchange, routing_key, body, properties)
            except UnroutableError as exc:
                raise UnroutableError(
                    f"no queue is bound for routing key {routing_key!r} on exchange "
                    f"{exchange!r}: the message was returned, not stored"
                ) from exc
            except NackedError as exc:
                raise NackedError(
                    f"the broker refused (nacked) the message to {exchange!r}"
                ) from exc
            except ChannelClosed as exc:
                raise PublishError(f"publish to {exchange!r} failed: {exc}") from exc

    def _send_until_stored(
        self, exchange: str, routing_key: str, body: bytes, properties: Mapping[str, Any]
    ) -> None:
        for pause in nack_pauses():
            try:
                return self._send(exchange, routing_key, body, properties)
            except NackedError:
                logger.warning(
                    "the broker nacked a message to %r; publishing it again in %.1fs",
                    exchange,
                    pause,
                )
                _pause(pause)
        self._send(exchange, routing_key, body, properties)

    def _send(
        self, exchange: str, routing_key: str, body: bytes, properties: Mapping[str, Any]
    ) -> None:
        """The transport's part of :meth:`publish_raw` (``testing`` has its own)."""

        def publish() -> None:
            self._ensure_channel().publish(exchange, routing_key, body, properties)

        self._reconnecting(publish, lambda exc: PublishError(f"publish failed: {exc}"))

    def publish(
        self,
        routing_key: str,
        body: Any,
        *,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        exchange: str | None = None,
        **properties: Any,
    ) -> PublishResult:
        data, ctype = encode_body(body, content_type)
        names = current_names()
        props = build_properties(ctype, headers, properties, names)
        exchange = exchange if exchange is not None else names.work_exchange
        self.publish_raw(exchange, routing_key, data, props)
        return PublishResult(props["message_id"], exchange, routing_key)

    def publish_many(
        self,
        routing_key: str,
        bodies: Iterable[Any],
        *,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        **properties: Any,
    ) -> list[PublishResult]:
        """Publish every body with pipelined confirms; return once the broker confirmed all.

        Up to ``BATCH_WINDOW`` messages are in flight at once on a dedicated confirm-mode
        channel, instead of one round trip per message. Every body is encoded before the
        first one is sent, so a body that is not JSON serialisable publishes nothing.
        If any message is nacked, returned as unroutable, or left unconfirmed (channel or
        connection lost, no answer within the timeout), this raises ``PublishError``
        (``UnroutableError`` if returns were the only failures). The exception carries
        ``confirmed`` (the :class:`PublishResult` of every message the broker did confirm)
        and ``failed`` (the message ids of the others); nothing unconfirmed is ever
        reported as published.
        """
        names = current_names()
        exchange = names.work_exchange
        items: list[broker.Outgoing] = []
        for body in bodies:
            data, ctype = encode_body(body, content_type)
            props = build_properties(ctype, headers, properties, names)
            items.append(broker.Outgoing(exchange, routing_key, data, props))
        if not items:
            return []
        with self._lock:
            self._publish_batch(items)
        return [PublishResult(i.message_id, i.exchange, i.routing_key) for i in items]

    def publish_raw_many(
        self,
        messages: Sequence[tuple[str, str, bytes, Mapping[str, Any]]],
        *,
        window: int = BATCH_WINDOW,
    ) -> list[bool]:
        """Publish exact (exchange, routing key, body, properties) messages, pipelined.

        Returns, per message, whether the broker confirmed it (acked and not returned); a
        nacked or unroutable message is ``False``, not an exception. If the broker cannot be
        reached (after one reconnect), raises ``PublishError`` whose ``statuses`` attribute
        has the same per-message answer for what was confirmed before. ``window`` bounds the
        messages unconfirmed at once, hence the duplicates a lost connection can cause.
        """
        items = [broker.Outgoing(ex, rk, body, props) for ex, rk, body, props in messages]
        try:
            self.publish_items(items, window)
        except PublishError as exc:
            exc.statuses = [i.confirmed for i in items]  # type: ignore[attr-defined]
            raise
        return [i.confirmed for i in items]

    def publish_items(self, items: Sequence[broker.Outgoing], window: int = BATCH_WINDOW) -> None:
        """Publish ``items`` pipelined; each ends with the broker's answer on it.

        A nacked or returned item is an answer (``item.nacked`` / ``item.returned``), not an
        exception. Raises ``PublishError`` only when some item got no answer (the broker
        could not be reached after one reconnect, the channel closed, no confirm in time).
        """
        if not items:
            return
        with self._lock:
            try:
                self._publish_batch(list(items), window)
            except PublishError:
                if any(i.nacked or i.returned for i in items) and all(i.state for i in items):
                    return  # every message was answered: the failures are per message
                raise

    def publish_stream(
        self, items: Iterable[broker.Outgoing | None], window: int = BATCH_WINDOW
    ) -> list[broker.Outgoing]:
        """Publish ``items`` as the iterable yields them; return them, each answered.

        For a lazy source (the outbox relay reading rows from a database cursor), so
        reading the next rows overlaps the broker's work on the last ones. A source that
        waits for the answers to what it gave yields ``None`` while it has nothing else:
        answers keep arriving meanwhile (items are answered as they come). No reconnect:
        if some item got no answer (connection lost, channel closed, no confirm in time)
        this raises ``PublishError`` whose ``sent`` holds what was published so far (the
        caller keeps the unanswered ones for later).
        """
        sent: list[broker.Outgoing] = []
        with self._lock:
            self._send_stream(items, window, sent)
        return sent

    def _send_stream(
        self,
        items: Iterable[broker.Outgoing | None],
        window: int,
        sent: list[broker.Outgoing] | None = None,
    ) -> None:
        """The transport's part of :meth:`publish_stream` and :meth:`publish_batches`
        (``testing`` has its own): ``sent`` (if given) collects what was published."""
        try:
            outcome = self._batch_pipeline().run(items, window, sent)
        except BrokerUnavailable as exc:
            raise _stream_error(sent, str(exc)) from exc
        except ConnectionLost as exc:
            self._drop()
            raise _stream_error(sent, f"publish failed: {exc}") from exc
        except BaseException:
            # The source raised, or a requeue's ``answered`` (its marks) did, with confirms
            # still pending: a pipeline with pending confirms is never used again, and its
            # channel would stay open beside the next one until the connection closes.
            self._retire_pipeline()
            raise
        if outcome.channel_error is not None:
            self._pipeline = None
            raise _stream_error(sent, f"publish failed: {outcome.channel_error}")
        if outcome.timed_out:
            self._drop()
            raise _stream_error(sent, "the broker did not confirm every message in time")

    def publish_batches(
        self,
        batches: Iterable[Batch | None],
        answered: Callable[[Batch], None],
        window: int = BATCH_WINDOW,
        most: int | None = None,
        deadline: float | None = None,
    ) -> None:
        """Publish batch after batch in one stream of confirms; ``answered(batch)`` runs on
        this thread once each of a batch's items has its final answer, in the batches' order.

        The next batches are written while the broker confirms the last (see
        :mod:`.batch_stream`), at most ``most`` batches in flight at once (when given: their
        bodies are memory); ``batches`` may yield ``None`` while it has nothing yet. An
        item ends confirmed, nacked (after :func:`nack_pauses`) or returned, as with
        :meth:`publish_items`. Raises ``PublishError`` when some item got no answer (the
        broker could not be reached after one reconnect, the channel closed, no confirm in
        time), after handing back every batch in flight (those items keep state ``""``);
        an exception of the source is raised once what was in flight is answered. One of
        ``answered`` is raised at once: the batches after it are not handed back, and the
        channel their confirms were due on is closed.

        ``deadline`` (a ``time.monotonic()`` value) bounds the pauses after nacks: one that
        would end past it is not taken, and what it was for stays nacked (an answer:
        refused). A caller with a time budget (the admin's requeue click) is otherwise held
        up to ``PUBLISH_NACK_WAIT`` past it while a cluster node stops.
        """
        with self._lock:
            stream = BatchStream(iter(batches), answered, most)
            idle_failures = 0  # streams in a row that failed before publishing anything
            while True:
                try:
                    self._send_stream(stream.items(), window)
                    idle_failures = 0
                except PublishError:
                    # Dropped or reset already; what got no answer is published again below.
                    idle_failures = idle_failures + 1 if not stream.published else 0
                    if idle_failures >= 2:
                        stream.settle(lambda items: None)
                        raise
                stream.settle(lambda items: self._answer(items, window, deadline))
                if stream.error is not None:
                    raise stream.error
                if stream.exhausted:
                    return

    def _batch_pipeline(self) -> broker.Pipeline:
        self._ensure_channel()  # (re)connects; also notices a dead connection
        assert self._connection is not None
        pipe = self._pipeline
        if pipe is None or not pipe.usable(self._connection):
            pipe = broker.Pipeline(self._connection)
            self._pipeline = pipe
        return pipe

    def _publish_batch(self, items: list[broker.Outgoing], window: int = BATCH_WINDOW) -> None:
        """Publish ``items`` pipelined; raise unless every one was confirmed (ack, not returned)."""
        self._answer(items, window)
        nacked = sum(1 for i in items if i.nacked)
        returned = sum(1 for i in items if i.returned)
        if nacked:
            raise _batch_error(
                items,
                f"the broker refused (nacked) {nacked} message(s) to {items[0].exchange!r}"
                + (f" and returned {returned} as unroutable" if returned else ""),
                PublishError,
            )
        if returned:
            raise _batch_error(
                items,
                f"no queue is bound for routing key {items[0].routing_key!r} on exchange "
                f"{items[0].exchange!r}: {returned} message(s) were returned, not stored",
                UnroutableError,
            )

    def _answer(
        self, items: list[broker.Outgoing], window: int, deadline: float | None = None
    ) -> None:
        """Publish ``items`` until each has its final answer: a nacked one is published
        again after each of :func:`nack_pauses` (those that end by ``deadline``, if given).
        Raises ``PublishError`` when some got none."""
        self._send_batch(items, window)
        for pause in nack_pauses():
            again = [i for i in items if i.nacked]
            if not again:
                break
            if deadline is not None and time.monotonic() + pause > deadline:
                logger.warning(
                    "the broker nacked %d message(s) to %r; not publishing them again: "
                    "the caller's time is up",
                    len(again),
                    again[0].exchange,
                )
                break
            logger.warning(
                "the broker nacked %d message(s) to %r; publishing them again in %.1fs",
                len(again),
                again[0].exchange,
                pause,
            )
            _pause(pause)
            for item in again:
                item.state = ""
            self._send_batch(again, window)

    def _send_batch(self, items: list[broker.Outgoing], window: int) -> None:
        """The transport's part of a batch: every item ends acked, nacked or returned, or
        this raises ``PublishError`` (connection lost twice, channel closed, no answer)."""
        todo = list(range(len(items)))

        def publish() -> broker.BatchOutcome | None:
            nonlocal todo
            # After a lost connection, which messages got through is unknown for every
            # one not confirmed yet: those are published again (at-least-once).
            todo = [i for i in todo if not items[i].confirmed]
            if not todo:
                return None
            return self._batch_pipeline().run((items[i] for i in todo), window)

        def give_up(exc: ConnectionLost) -> PublishError | None:
            if all(items[i].confirmed for i in todo):
                return None
            return _batch_error(items, f"publish failed: {exc}", PublishError)

        outcome = self._reconnecting(publish, give_up)
        if outcome is None:
            return
        if outcome.channel_error is not None:
            self._pipeline = None
            raise _batch_error(
                items,
                f"publish to {items[0].exchange!r} failed: {outcome.channel_error}",
                PublishError,
            )
        if outcome.timed_out:
            self._drop()
            raise _batch_error(
                items, "the broker did not confirm every message in time", PublishError
            )


def _batch_error(items: list[broker.Outgoing], text: str, kind: type[PublishError]) -> PublishError:
    confirmed = [
        PublishResult(i.message_id, i.exchange, i.routing_key) for i in items if i.confirmed
    ]
    failed = [i.message_id for i in items if not i.confirmed]
    exc = kind(f"{text} ({len(confirmed)} of {len(items)} confirmed)")
    exc.confirmed = confirmed  # type: ignore[attr-defined]
    exc.failed = failed  # type: ignore[attr-defined]
    return exc


def _stream_error(sent: list[broker.Outgoing] | None, text: str) -> PublishError:
    exc = PublishError(text)
    exc.sent = sent or []  # type: ignore[attr-defined]
    return exc


_publisher: Any = None
_publisher_lock = threading.Lock()


def get_publisher() -> Publisher:
    """The process-wide publisher (created on first use; ``testing`` installs its own)."""
    global _publisher, _closes_at_exit
    with _publisher_lock:
        if _publisher is None:
            _publisher = Publisher()
            if not _closes_at_exit:
                atexit.register(_close_at_exit)
                _closes_at_exit = True
        return _publisher


_closes_at_exit = False


def _close_at_exit() -> None:
    """Close the process's publisher connection when the interpreter exits.

    Without it every process that ever published (a web worker, a management command)
    leaves by dropping its socket, and the broker logs "client unexpectedly closed TCP
    connection" for each. A forked child leaves its parent's connection alone: closing it
    would write on the parent's socket.
    """
    publisher = _publisher
    if not isinstance(publisher, Publisher) or publisher._pid != os.getpid():
        return
    try:
        publisher.close()
    except Exception:  # the broker may be gone already; exit quietly
        logger.debug("closing the publisher at exit failed", exc_info=True)


def install(publisher: Any) -> Any:
    """Make ``publisher`` the process-wide one; returns the one it replaces (or ``None``).

    For ``django_rmq_retry.testing``, whose in-memory broker publishes in place of RabbitMQ.
    """
    global _publisher
    with _publisher_lock:
        previous, _publisher = _publisher, publisher
    return previous


def reset_publisher() -> None:
    """Close and forget the process-wide publisher (tests, settings changes, after fork)."""
    global _publisher
    with _publisher_lock:
        if _publisher is not None:
            _publisher.close()
        _publisher = None
