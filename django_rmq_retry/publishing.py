"""Publishing with publisher confirms, one connection per process, safe in threads.

``Topic.send`` lands here. A publish returns only once the broker confirmed it; an
unroutable message (no queue bound) raises instead of being silently dropped.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pika.exceptions as pex
from django.core.serializers.json import DjangoJSONEncoder

from . import broker
from .conf import app_settings
from .errors import BrokerUnavailable, PublishError, TopologyError, UnroutableError
from .names import Names

logger = logging.getLogger("django_rmq_retry.publishing")

#: Messages a batch keeps unconfirmed at once (bounds client memory, keeps the pipe full).
_BATCH_WINDOW = 1000
#: Seconds without any confirm after which a batch gives up (the messages count as failed).
_BATCH_STALL_TIMEOUT = 30.0
#: Messages of a batch written between two runs of the I/O loop (which sends them).
_FLUSH_EVERY = 100
#: A connection idle for longer is polled before use, so one the broker closed meanwhile
#: (missed heartbeats, a restart) is replaced quietly instead of failing the publish first.
_IDLE_CHECK_AFTER = 1.0


@dataclass(frozen=True)
class PublishResult:
    message_id: str
    exchange: str
    routing_key: str


def encode_body(body: Any, content_type: str | None) -> tuple[bytes, str]:
    """Bytes and content type: bytes/str pass through, anything else becomes JSON."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type or "application/octet-stream"
    if isinstance(body, str) and (content_type is None or not content_type.endswith("json")):
        return body.encode("utf-8"), content_type or "text/plain; charset=utf-8"
    try:
        data = json.dumps(body, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"message body is not JSON serialisable: {exc}") from exc
    return data.encode("utf-8"), content_type or "application/json"


def build_properties(
    content_type: str,
    headers: Mapping[str, Any] | None,
    properties: Mapping[str, Any],
) -> dict[str, Any]:
    unknown = set(properties) - {
        "message_id",
        "correlation_id",
        "reply_to",
        "priority",
        "type",
        "app_id",
        "timestamp",
        "content_encoding",
        "expiration",
        "user_id",
        "cluster_id",
    }
    if unknown:
        raise TypeError(f"unknown message properties: {', '.join(sorted(unknown))}")
    props: dict[str, Any] = dict(properties)
    props["content_type"] = content_type
    props["delivery_mode"] = 2
    props["headers"] = dict(headers or {})
    props.setdefault("message_id", uuid.uuid4().hex)
    props.setdefault("timestamp", int(time.time()))
    return props


class Publisher:
    """A lazily opened, confirm-mode channel guarded by a lock. One per process."""

    #: The channel ``publish_many`` pipelines confirms on (opened on first use).
    _pipeline: _ConfirmPipeline | None = None

    def __init__(self, url: str | None = None, *, declare: bool = True) -> None:
        self._url = url
        self._declare = declare
        self._lock = threading.RLock()
        self._connection: Any = None
        self._channel: Any = None
        self._pid = os.getpid()
        self._last_used = 0.0  # time.monotonic() of the last publish on this connection

    # Connection management ----------------------------------------------------------------
    def _ensure_channel(self) -> Any:
        if self._pid != os.getpid():  # forked: never share a socket with the parent
            self._connection = self._channel = None
            self._pid = os.getpid()
        now = time.monotonic()
        if (
            self._channel is not None
            and self._channel.is_open
            and now - self._last_used > _IDLE_CHECK_AFTER
        ):
            # Only after a pause: in a busy loop every publish already does I/O on this
            # connection (its confirm), and a poll per publish cost a tenth of a send. A
            # connection that dies between two busy publishes fails that publish, which
            # then reconnects and publishes again (the same at-least-once path).
            try:
                self._connection.process_data_events(0)
            except broker.CONNECTION_ERRORS:
                self._drop()
        self._last_used = now
        if self._channel is None or not self._channel.is_open:
            self._drop()
            self._connection = broker.connect(
                self._url,
                name=f"django-rmq-retry publisher {app_settings.PREFIX} pid {os.getpid()}",
            )
            channel = self._connection.channel()
            channel.confirm_delivery()
            if self._declare:
                self._declare_topology(channel)
            self._channel = channel
        return self._channel

    def _declare_topology(self, channel: Any) -> None:
        from . import topology
        from .topics import default_registry

        try:
            topology.declare(channel, topology.plan(default_registry.all()))
        except TopologyError:
            self._drop()
            raise

    def _drop(self) -> None:
        conn, self._connection, self._channel = self._connection, None, None
        if conn is not None:
            try:
                if conn.is_open:
                    conn.close()
            except Exception:  # already dead: nothing to clean
                logger.debug("closing a dead publisher connection failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._drop()

    # Publishing ---------------------------------------------------------------------------
    def publish_raw(
        self, exchange: str, routing_key: str, body: bytes, properties: Mapping[str, Any]
    ) -> None:
        """Publish exactly these bytes and properties; return once confirmed."""
        props = broker.to_pika(properties)
        with self._lock:
            for attempt in (1, 2):
                try:
                    channel = self._ensure_channel()
                    channel.basic_publish(exchange, routing_key, body, props, mandatory=True)
                    return
                except pex.UnroutableError as exc:
                    raise UnroutableError(
                        f"no queue is bound for routing key {routing_key!r} on exchange "
                        f"{exchange!r}: the message was returned, not stored"
                    ) from exc
                except pex.NackError as exc:
                    raise PublishError(
                        f"the broker refused (nacked) the message to {exchange!r}"
                    ) from exc
                except pex.ChannelClosedByBroker as exc:
                    self._drop()
                    raise PublishError(
                        f"publish to {exchange!r} failed: {broker.describe(exc)}"
                    ) from exc
                except BrokerUnavailable as exc:
                    raise PublishError(str(exc)) from exc
                except broker.CONNECTION_ERRORS as exc:
                    self._drop()
                    if attempt == 2:
                        raise PublishError(f"publish failed: {broker.describe(exc)}") from exc
                    logger.warning(
                        "publisher connection lost (%s); reconnecting", broker.describe(exc)
                    )

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
        props = build_properties(ctype, headers, properties)
        exchange = exchange if exchange is not None else Names(app_settings.PREFIX).work_exchange
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

        Up to ``_BATCH_WINDOW`` messages are in flight at once on a dedicated confirm-mode
        channel, instead of one round trip per message. Every body is encoded before the
        first one is sent, so a body that is not JSON serialisable publishes nothing.
        If any message is nacked, returned as unroutable, or left unconfirmed (channel or
        connection lost, no answer within the timeout), this raises ``PublishError``
        (``UnroutableError`` if returns were the only failures). The exception carries
        ``confirmed`` (the :class:`PublishResult` of every message the broker did confirm)
        and ``failed`` (the message ids of the others); nothing unconfirmed is ever
        reported as published.
        """
        exchange = Names(app_settings.PREFIX).work_exchange
        items: list[_BatchItem] = []
        for body in bodies:
            data, ctype = encode_body(body, content_type)
            props = build_properties(ctype, headers, properties)
            items.append(_BatchItem(exchange, routing_key, data, broker.to_pika(props)))
        if not items:
            return []
        with self._lock:
            self._publish_batch(items)
        return [PublishResult(i.properties.message_id, i.exchange, i.routing_key) for i in items]

    def publish_raw_many(
        self,
        messages: Sequence[tuple[str, str, bytes, Mapping[str, Any]]],
        *,
        window: int = _BATCH_WINDOW,
    ) -> list[bool]:
        """Publish exact (exchange, routing key, body, properties) messages, pipelined.

        Returns, per message, whether the broker confirmed it (acked and not returned); a
        nacked or unroutable message is ``False``, not an exception. If the broker cannot be
        reached (after one reconnect), raises ``PublishError`` whose ``statuses`` attribute
        has the same per-message answer for what was confirmed before. ``window`` bounds the
        messages unconfirmed at once, hence the duplicates a lost connection can cause.
        """
        items = [
            _BatchItem(ex, rk, body, broker.to_pika(props)) for ex, rk, body, props in messages
        ]
        if not items:
            return []
        with self._lock:
            try:
                self._publish_batch(items, window)
            except PublishError as exc:
                if any(i.nacked or i.returned for i in items) and all(i.state for i in items):
                    pass  # every message was answered: the failures are per message
                else:
                    exc.statuses = [i.confirmed for i in items]  # type: ignore[attr-defined]
                    raise
        return [i.confirmed for i in items]

    def _batch_channel(self) -> _ConfirmPipeline:
        self._ensure_channel()  # (re)connects; also notices a dead connection
        pipe = self._pipeline
        if pipe is None or not pipe.usable(self._connection):
            pipe = _ConfirmPipeline(self._connection)
            self._pipeline = pipe
        return pipe

    def _publish_batch(self, items: list[_BatchItem], window: int = _BATCH_WINDOW) -> None:
        """Publish ``items`` pipelined; raise unless every one was confirmed (ack, not returned)."""
        todo = list(range(len(items)))
        for attempt in (1, 2):
            try:
                pipe = self._batch_channel()
                outcome = pipe.run(items, todo, window)
            except BrokerUnavailable as exc:
                raise PublishError(str(exc)) from exc
            except broker.CONNECTION_ERRORS as exc:
                # The connection died mid-batch: which messages got through is unknown for
                # every one not confirmed yet, so publish those again once (at-least-once,
                # like publish_raw); the second loss is an error.
                self._drop()
                self._pipeline = None
                todo = [i for i in todo if not items[i].confirmed]
                if attempt == 2 or not todo:
                    if not todo:
                        return
                    raise self._batch_error(
                        items, f"publish failed: {broker.describe(exc)}", PublishError
                    ) from exc
                logger.warning(
                    "publisher connection lost during a batch (%s); reconnecting and "
                    "publishing the %d unconfirmed message(s) again",
                    broker.describe(exc),
                    len(todo),
                )
                continue
            if outcome.channel_error is not None:
                self._pipeline = None
                raise self._batch_error(
                    items,
                    f"publish to {items[0].exchange!r} failed: "
                    f"{broker.describe(outcome.channel_error)}",
                    PublishError,
                )
            if outcome.timed_out:
                self._drop()
                self._pipeline = None
                raise self._batch_error(
                    items, "the broker did not confirm every message in time", PublishError
                )
            nacked = sum(1 for i in items if i.nacked)
            returned = sum(1 for i in items if i.returned)
            if nacked or returned:
                if nacked:
                    raise self._batch_error(
                        items,
                        f"the broker refused (nacked) {nacked} message(s) to "
                        f"{items[0].exchange!r}"
                        + (f" and returned {returned} as unroutable" if returned else ""),
                        PublishError,
                    )
                raise self._batch_error(
                    items,
                    f"no queue is bound for routing key {items[0].routing_key!r} on exchange "
                    f"{items[0].exchange!r}: {returned} message(s) were returned, not stored",
                    UnroutableError,
                )
            return

    @staticmethod
    def _batch_error(items: list[_BatchItem], text: str, kind: type[PublishError]) -> PublishError:
        confirmed = [
            PublishResult(i.properties.message_id, i.exchange, i.routing_key)
            for i in items
            if i.confirmed
        ]
        failed = [i.properties.message_id for i in items if not i.confirmed]
        exc = kind(f"{text} ({len(confirmed)} of {len(items)} confirmed)")
        exc.confirmed = confirmed  # type: ignore[attr-defined]
        exc.failed = failed  # type: ignore[attr-defined]
        return exc


class _BatchItem:
    """One message of a batch and what the broker said about it."""

    __slots__ = ("body", "exchange", "properties", "returned", "routing_key", "state")

    def __init__(self, exchange: str, routing_key: str, body: bytes, properties: Any) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.body = body
        self.properties = properties
        self.state = ""  # "" unsent/unknown, "ack", "nack"
        self.returned = False

    @property
    def confirmed(self) -> bool:
        """Acked by the broker and not returned: stored in at least one queue."""
        return self.state == "ack" and not self.returned

    @property
    def nacked(self) -> bool:
        return self.state == "nack"


@dataclass
class _BatchOutcome:
    channel_error: BaseException | None = None
    timed_out: bool = False


class _ConfirmPipeline:
    """Publishes a batch on a :class:`broker.ConfirmChannel`, many confirms in flight.

    Messages are written back to back and the connection's I/O loop is pumped until at most
    a window's worth are unconfirmed, then until every one is acked or nacked.
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.channel = broker.ConfirmChannel(connection)
        self.channel.on_broken = self._wake
        self.wake_at: int = -1  # wake the I/O loop once this few are unconfirmed
        self._woken = False
        deadline = time.monotonic() + _BATCH_STALL_TIMEOUT
        while not self.channel.ready:
            if self.closed is not None:
                raise pex.ChannelClosed(0, f"confirm.select failed: {self.closed}")
            if time.monotonic() > deadline:
                raise pex.AMQPConnectionError("no confirm.select-ok from the broker")
            self._pump(0.05)

    @property
    def closed(self) -> BaseException | None:
        return self.channel.broken

    @property
    def unconfirmed(self) -> int:
        return len(self.channel.pending)

    def usable(self, connection: Any) -> bool:
        return (
            connection is self.connection
            and self.closed is None
            and self.channel.impl.is_open
            and not self.channel.pending
        )

    # Callbacks (run inside the connection's I/O loop) ------------------------------------
    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            self.connection.call_later(0, _noop)

    def _settle(self, item: _BatchItem, acked: bool, returned: bool) -> None:
        item.state = "ack" if acked else "nack"
        item.returned = returned
        if self.unconfirmed <= self.wake_at:
            self._wake()

    # Driving -----------------------------------------------------------------------------
    def _pump(self, seconds: float) -> None:
        self._woken = False
        self.connection.process_data_events(time_limit=seconds)

    def _wait_until(self, at_most: int) -> bool:
        """Pump I/O until at most ``at_most`` messages are unconfirmed; False on a stall."""
        last = self.unconfirmed
        deadline = time.monotonic() + _BATCH_STALL_TIMEOUT
        while self.unconfirmed > at_most and self.closed is None:
            self.wake_at = at_most
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._pump(min(remaining, 1.0))
            if self.unconfirmed < last:  # progress: the stall clock starts over
                last = self.unconfirmed
                deadline = time.monotonic() + _BATCH_STALL_TIMEOUT
        self.wake_at = -1
        return True

    def run(
        self, items: list[_BatchItem], todo: list[int], window: int = _BATCH_WINDOW
    ) -> _BatchOutcome:
        outcome = _BatchOutcome()
        low = window // 2
        for sent, index in enumerate(todo, 1):
            if self.unconfirmed >= window and not self._wait_until(low):
                outcome.timed_out = True
                return outcome
            if self.closed is not None:
                break
            item = items[index]
            item.state = ""
            item.returned = False
            self.channel.publish(
                item.exchange,
                item.routing_key,
                item.body,
                item.properties,
                functools.partial(self._settle, item),
            )
            if sent % _FLUSH_EVERY == 0:
                # Frames wait in pika's buffer until the I/O loop runs: hand them to the
                # socket (and take in confirms) while the next ones are marshalled.
                self._pump(0)
        if self.closed is None and not self._wait_until(0):
            outcome.timed_out = True
        if self.closed is not None:
            outcome.channel_error = self.closed
        return outcome


def _noop() -> None:
    """Timer callback whose only job is to make ``process_data_events`` return."""


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def get_publisher() -> Publisher:
    """The process-wide publisher (created on first use)."""
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            _publisher = Publisher()
        return _publisher


def reset_publisher() -> None:
    """Close and forget the process-wide publisher (tests, settings changes, after fork)."""
    global _publisher
    with _publisher_lock:
        if _publisher is not None:
            _publisher.close()
        _publisher = None
