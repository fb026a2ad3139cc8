"""The one module that knows pika: connections, channels, properties, readable errors.

pika 2.0 drops ``BlockingConnection``; keeping every pika call behind this module (and
``topology.py``) means a later transport swap touches few files.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.exceptions as pex

from .conf import app_settings
from .envelope import PROPERTY_NAMES, UNDECODABLE_HEADERS
from .errors import BrokerUnavailable

logger = logging.getLogger("django_rmq_retry.broker")

#: Errors after which a connection is gone and must be rebuilt.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pex.AMQPConnectionError,
    pex.ConnectionClosed,
    pex.StreamLostError,
    pex.ChannelWrongStateError,
    pex.ConnectionWrongStateError,
    pex.ChannelClosed,
    ConnectionError,
    OSError,
)


def _guard_header_decoding() -> None:
    """Make pika survive header tables it cannot decode.

    Another client can publish headers nested thousands of levels deep (RabbitMQ accepts
    them) or of a field type pika does not know. pika decodes content headers recursively
    inside the connection's I/O, so such a message raised ``RecursionError`` there, killed
    the connection, and came back at the head of the queue on every reconnect: a crash
    loop no receiver code could stop. The top-level table decode used for properties is
    wrapped: an undecodable table becomes ``{UNDECODABLE_HEADERS: reason}`` (its length
    prefix lets us skip it), and the consumer parks the message as undecodable.
    """
    import struct
    import types

    import pika.data
    import pika.spec

    if getattr(pika.spec.data, "_rmq_retry_guard", False):  # type: ignore[attr-defined]
        return
    original = pika.data.decode_table

    def decode_table(encoded: bytes, offset: int) -> tuple[dict[str, Any], int]:
        try:
            return original(encoded, offset)
        except (RecursionError, pex.InvalidFieldTypeException, struct.error, ValueError) as exc:
            size = struct.unpack_from(">I", encoded, offset)[0]
            reason = (
                "headers nested too deeply to decode"
                if isinstance(exc, RecursionError)
                else f"headers cannot be decoded ({type(exc).__name__}: {exc})"
            )
            return {UNDECODABLE_HEADERS: reason[:200]}, offset + 4 + size

    guarded = types.ModuleType(pika.data.__name__)
    guarded.__dict__.update(vars(pika.data))
    guarded.decode_table = decode_table  # type: ignore[attr-defined]
    guarded._rmq_retry_guard = True  # type: ignore[attr-defined]
    pika.spec.data = guarded  # type: ignore[attr-defined]


_guard_header_decoding()


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (safe for logs and pages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def connection_parameters(url: str | None = None, **overrides: Any) -> pika.URLParameters:
    url = url or app_settings.BROKER_URL
    params = pika.URLParameters(url)
    params.heartbeat = int(overrides.get("heartbeat", app_settings.HEARTBEAT))
    params.blocked_connection_timeout = float(
        overrides.get("blocked_connection_timeout", app_settings.BLOCKED_CONNECTION_TIMEOUT)
    )
    timeout = float(app_settings.CONNECT_TIMEOUT)
    params.socket_timeout = timeout
    params.stack_timeout = timeout * 2
    params.connection_attempts = 1
    params.client_properties = {"connection_name": overrides.get("name", "django-rmq-retry")}
    if urlsplit(url).scheme == "amqps":
        context = ssl.create_default_context(cafile=app_settings.TLS_CA_FILE)
        if app_settings.TLS_CERT_FILE:
            context.load_cert_chain(app_settings.TLS_CERT_FILE, app_settings.TLS_KEY_FILE)
        params.ssl_options = pika.SSLOptions(context, server_hostname=urlsplit(url).hostname)
    return params


def connect(url: str | None = None, **overrides: Any) -> pika.BlockingConnection:
    """A blocking connection, or :class:`BrokerUnavailable` with one readable line."""
    url = url or app_settings.BROKER_URL
    try:
        return pika.BlockingConnection(connection_parameters(url, **overrides))
    except pex.ProbableAuthenticationError as exc:
        raise BrokerUnavailable(
            f"RabbitMQ at {mask_url(url)} refused the login (check user and password)"
        ) from exc
    except pex.ProbableAccessDeniedError as exc:
        raise BrokerUnavailable(
            f"RabbitMQ at {mask_url(url)} denied access to the virtual host"
        ) from exc
    except (pex.AMQPConnectionError, OSError) as exc:
        raise BrokerUnavailable(
            f"cannot reach RabbitMQ at {mask_url(url)}: {describe(exc)}"
        ) from exc


def describe(exc: BaseException) -> str:
    """A short human description of a pika error, never including credentials."""
    if isinstance(exc, pex.AMQPConnectionError) and exc.args:
        inner = exc.args[0]
        if isinstance(inner, BaseException):
            return describe(inner)
    if isinstance(exc, pex.ChannelClosedByBroker | pex.ConnectionClosedByBroker):
        return f"{exc.reply_code} {exc.reply_text}"
    text = str(exc) or type(exc).__name__
    if "Connection refused" in text or isinstance(exc, ConnectionRefusedError):
        return "connection refused (is RabbitMQ running?)"
    return text


def to_pika(properties: Mapping[str, Any]) -> pika.BasicProperties:
    return pika.BasicProperties(**{k: properties.get(k) for k in PROPERTY_NAMES})


def from_pika(properties: pika.BasicProperties) -> dict[str, Any]:
    return {k: getattr(properties, k, None) for k in PROPERTY_NAMES}


class ConfirmChannel:
    """A confirm-mode channel whose publishes do not wait for their confirm.

    ``BlockingChannel.basic_publish`` waits for each confirm before returning. Here the
    underlying pika ``Channel`` is put in confirm mode with our own callbacks: ``publish``
    returns at once and ``on_settled(acked, returned)`` runs inside the connection's I/O loop
    once the broker answered (ack, nack, or a return followed by its ack). Both the
    consumer's retry copies and the publisher's pipelined batches use it.

    The broker sends ``basic.return`` for an unroutable mandatory message before its
    ``basic.ack``, so a return marks the oldest unconfirmed message with the same id,
    route and body (message ids alone are not unique: a requeue of rows copied from one
    message, a careless publisher). If the channel closes, ``broken`` says why and
    pending callbacks never fire: the owner drops the connection, and what waited on
    them is redelivered or published again.
    """

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self.connection = connection
        self.impl = connection.channel()._impl  # type: ignore[attr-defined]  # pika has no public async handle
        self.next_tag = 1
        self.pending: dict[int, _Pending] = {}  # insertion order == tag order
        self._by_message: dict[Any, list[int]] = {}
        self.broken: BaseException | None = None
        self.on_broken: Callable[[], None] | None = None
        self.ready = False
        self.impl.add_on_return_callback(self._on_return)
        self.impl.add_on_close_callback(self._on_close)
        # No need to wait for confirm.select-ok before publishing: the broker handles it
        # before any later publish on this channel, so delivery tags still start at 1.
        self.impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: self._set_ready()
        )

    def _set_ready(self) -> None:
        self.ready = True

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        on_settled: Callable[[bool, bool], None],
    ) -> None:
        if self.broken is not None:
            raise pex.ChannelWrongStateError(f"confirm channel closed: {self.broken}")
        tag = self.next_tag
        self.next_tag += 1
        self.pending[tag] = _Pending(on_settled, properties.message_id, exchange, routing_key, body)
        self._by_message.setdefault(properties.message_id, []).append(tag)
        self.impl.basic_publish(exchange, routing_key, body, properties, mandatory=True)

    def _on_return(self, _channel: Any, method: Any, properties: Any, body: bytes) -> None:
        for tag in self._by_message.get(properties.message_id, ()):
            entry = self.pending.get(tag)
            if (
                entry is not None
                and not entry.returned
                and entry.exchange == method.exchange
                and entry.routing_key == method.routing_key
                and entry.body == body
            ):
                entry.returned = True
                return
        logger.error("a returned message (id %r) matches no pending publish", properties.message_id)

    def _on_close(self, _channel: Any, reason: BaseException) -> None:
        self.broken = reason
        if self.on_broken is not None:
            self.on_broken()

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if method.multiple:
            tags = []
            for tag in self.pending:
                if tag > method.delivery_tag:
                    break
                tags.append(tag)
        else:
            tags = [method.delivery_tag] if method.delivery_tag in self.pending else []
        acked = method.NAME == "Basic.Ack"
        for tag in tags:
            entry = self.pending.pop(tag)
            same = self._by_message.get(entry.message_id)
            if same is not None:
                same.remove(tag)
                if not same:
                    del self._by_message[entry.message_id]
            entry.on_settled(acked, entry.returned)


@dataclass(slots=True)
class _Pending:
    on_settled: Callable[[bool, bool], None]
    message_id: Any
    exchange: str
    routing_key: str
    body: bytes
    returned: bool = False


def settled_reason(acked: bool, returned: bool) -> str:
    """Why a publish did not count as stored ("" if it did)."""
    if acked and not returned:
        return ""
    return "returned as unroutable" if returned else "nacked by the broker"
