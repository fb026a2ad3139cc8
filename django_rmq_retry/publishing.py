"""Publishing with publisher confirms, one connection per process, safe in threads.

``Topic.send`` lands here. A publish returns only once the broker confirmed it; an
unroutable message (no queue bound) raises instead of being silently dropped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pika.exceptions as pex
from django.core.serializers.json import DjangoJSONEncoder

from . import broker
from .conf import app_settings
from .errors import BrokerUnavailable, PublishError, TopologyError, UnroutableError
from .names import Names

logger = logging.getLogger("django_rmq_retry.publishing")


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

    def __init__(self, url: str | None = None, *, declare: bool = True) -> None:
        self._url = url
        self._declare = declare
        self._lock = threading.RLock()
        self._connection: Any = None
        self._channel: Any = None
        self._pid = os.getpid()

    # Connection management ----------------------------------------------------------------
    def _ensure_channel(self) -> Any:
        if self._pid != os.getpid():  # forked: never share a socket with the parent
            self._connection = self._channel = None
            self._pid = os.getpid()
        if self._channel is not None and self._channel.is_open:
            try:
                self._connection.process_data_events(0)  # notice a dead connection now
            except broker.CONNECTION_ERRORS:
                self._drop()
        if self._channel is None or not self._channel.is_open:
            self._drop()
            self._connection = broker.connect(self._url, name="django-rmq-retry publisher")
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
        """Publish every body; returns once all are confirmed (see ``publish``)."""
        results = []
        with self._lock:
            for body in bodies:
                results.append(
                    self.publish(
                        routing_key, body, headers=headers, content_type=content_type, **properties
                    )
                )
        return results


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
