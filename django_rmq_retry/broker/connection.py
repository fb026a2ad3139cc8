"""Connections and channels: pika's blocking connection behind a small surface of ours.

A :class:`Connection` is short-lived administrative work (declaring the topology, reading
queue depths): the consumer and the publishers run on event loops (``links``). It belongs
to the thread that opened it (pika's rule). Every call translates pika's errors into ours
(``broker.translate``), and deliveries reach the caller as plain values, so nothing
outside this package ever sees a pika object.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import pika
import pika.exceptions as pex

from ..conf import app_settings, broker_urls
from ..core.envelope import PROPERTY_NAMES
from ..core.errors import AccessRefused, BrokerUnavailable, ConnectionLost
from ..core.failover import connect_order
from ..core.topology_plan import Plan
from ..core.undecodable import RAW_EXCHANGE, RAW_ROUTING_KEY
from . import headerguard
from .topology import declare
from .translate import LOST, describe, translated

logger = logging.getLogger("django_rmq_retry.broker")

#: ``on_message(delivery_tag, exchange, routing_key, redelivered, properties, body)``
OnMessage = Callable[[int, str, str, bool, dict[str, Any], bytes], None]


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
    if ":" in host:  # an IPv6 address keeps its brackets (else its port reads as part of it)
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


#: Connection options a broker URL may carry in its query (pika's names); each one given
#: there wins over the value our settings would set (docs/reference/broker-url.md).
URL_OPTIONS = frozenset(
    {
        "blocked_connection_timeout",
        "channel_max",
        "client_properties",
        "connection_attempts",
        "frame_max",
        "heartbeat",
        "locale",
        "retry_delay",
        "socket_timeout",
        "ssl_options",
        "stack_timeout",
        "tcp_options",
    }
)


def url_options(url: str) -> frozenset[str]:
    """The connection options ``url``'s query sets (the URL is the user's: those win)."""
    return frozenset(name for name, _value in parse_qsl(urlsplit(url).query) if name in URL_OPTIONS)


def connection_parameters(url: str | None = None, **overrides: Any) -> pika.URLParameters:
    """pika's parameters for ``url``: what its query sets, and ours for what it leaves out.

    Ours are the settings (``HEARTBEAT``, ``BLOCKED_CONNECTION_TIMEOUT``,
    ``CONNECT_TIMEOUT``, ``TLS_*``), or what the caller asks for this connection
    (``overrides``: its name, a publishing-only connection's blocked timeout). An option in
    the URL's query always wins: ``?heartbeat=7`` negotiates 7 whatever ``HEARTBEAT`` says.
    """
    url = url or broker_urls()[0]
    params = pika.URLParameters(url)
    given = url_options(url)
    if "heartbeat" not in given:
        params.heartbeat = int(overrides.get("heartbeat", app_settings.HEARTBEAT))
    if "blocked_connection_timeout" not in given:
        blocked = overrides.get(
            "blocked_connection_timeout", app_settings.BLOCKED_CONNECTION_TIMEOUT
        )
        # None: wait out a memory or disk alarm however long it lasts (a publishing-only
        # connection whose owner keeps its other connection, and heartbeats, alive).
        params.blocked_connection_timeout = None if blocked is None else float(blocked)
    if "socket_timeout" not in given:
        params.socket_timeout = float(app_settings.CONNECT_TIMEOUT)
    if "stack_timeout" not in given:
        params.stack_timeout = float(params.socket_timeout or app_settings.CONNECT_TIMEOUT) * 2
    if "connection_attempts" not in given:
        params.connection_attempts = 1  # our own loops retry, with failover and backoff
    name = overrides.get("name", "django-rmq-retry")
    if "client_properties" in given:
        params.client_properties = {"connection_name": name, **(params.client_properties or {})}
    else:
        params.client_properties = {"connection_name": name}
    if urlsplit(url).scheme == "amqps" and "ssl_options" not in given:
        context = ssl.create_default_context(cafile=app_settings.TLS_CA_FILE)
        if app_settings.TLS_CERT_FILE:
            context.load_cert_chain(app_settings.TLS_CERT_FILE, app_settings.TLS_KEY_FILE)
        params.ssl_options = pika.SSLOptions(context, server_hostname=urlsplit(url).hostname)
    return params


def connect(url: str | None = None, *, after: str | None = None, **overrides: Any) -> Connection:
    """A connection to ``url``, else to the first configured broker URL that answers.

    Without ``url`` the URLs of ``BROKER_URLS`` are tried in turn, starting after ``after``
    (the URL whose connection was just lost). A refused login stops the round: every node
    of a cluster shares its users. When none answers, the last URL's error is raised.
    """
    urls = [url] if url else connect_order(broker_urls(), after)
    for index, candidate in enumerate(urls):
        try:
            return _connect_one(candidate, **overrides)
        except AccessRefused:
            raise
        except BrokerUnavailable as exc:
            if index == len(urls) - 1:
                raise
            logger.warning("%s; trying %s", exc, mask_url(urls[index + 1]))
    raise AssertionError("unreachable: there is always one URL")


def _connect_one(url: str, **overrides: Any) -> Connection:
    """A connection, or :class:`BrokerUnavailable` with one readable line (no password)."""
    headerguard.install()  # on first use: pika changed for our connections' I/O only
    try:
        params = connection_parameters(url, **overrides)
        with headerguard.decoding():
            raw = pika.BlockingConnection(params)
        return Connection(raw, url, frame_max=params.frame_max)
    except pex.ProbableAuthenticationError as exc:
        raise AccessRefused(
            f"RabbitMQ at {mask_url(url)} refused the login (check user and password)"
        ) from exc
    except pex.ProbableAccessDeniedError as exc:
        raise AccessRefused(
            f"RabbitMQ at {mask_url(url)} denied access to the virtual host"
        ) from exc
    except (pex.AMQPConnectionError, OSError) as exc:
        raise BrokerUnavailable(
            f"cannot reach RabbitMQ at {mask_url(url)}: {describe(exc)}"
        ) from exc


@contextlib.contextmanager
def _io() -> Iterator[None]:
    """Around a call that may read from one of our connections: pika's errors become ours,
    and the header tables read meanwhile are guarded (``headerguard``: ours only)."""
    with translated(), headerguard.decoding():
        yield


def to_pika(properties: Mapping[str, Any]) -> pika.BasicProperties:
    return pika.BasicProperties(**{k: properties.get(k) for k in PROPERTY_NAMES})


_PROPERTY_SET = frozenset(PROPERTY_NAMES)


def from_pika(properties: pika.BasicProperties) -> dict[str, Any]:
    values = vars(properties)
    if values.keys() == _PROPERTY_SET:  # pika sets every one (None when absent): one copy
        return dict(values)
    return {k: getattr(properties, k, None) for k in PROPERTY_NAMES}


def _text(name: str | bytes, properties: dict[str, Any], raw_key: str) -> str:
    """A delivery's exchange or routing key as text.

    pika hands over a name that is not UTF-8 as ``bytes``; it is passed on readable (with
    backslash escapes) and its bytes go into the properties under ``raw_key``, where the
    core sees it and parks the message as undecodable (``core.undecodable``).
    """
    if isinstance(name, bytes):
        properties[raw_key] = name
        return name.decode("utf-8", "backslashreplace")
    return name


def delivering(on_message: OnMessage) -> Callable[[Any, Any, Any, bytes], None]:
    """pika's ``on_message_callback`` for ``basic_consume`` that hands ``on_message`` plain
    values (any channel kind: blocking, or on an event loop)."""

    def deliver(_channel: Any, method: Any, properties: Any, body: bytes) -> None:
        props = from_pika(properties)
        on_message(
            method.delivery_tag,
            _text(method.exchange, props, RAW_EXCHANGE),
            _text(method.routing_key, props, RAW_ROUTING_KEY),
            bool(method.redelivered),
            props,
            body,
        )

    return deliver


class Connection:
    """One AMQP connection (to ``url``). Closing it never raises.

    ``frame_max`` is the largest frame this connection may send: what its parameters asked
    for (the URL's ``frame_max``, else pika's default, RabbitMQ's too). The broker answers
    with its own limit and the smaller one wins; pika keeps the result to itself, so a
    broker configured below the client's value must be matched in the URL.
    """

    def __init__(
        self,
        raw: pika.BlockingConnection,
        url: str = "",
        *,
        frame_max: int = pika.ConnectionParameters.DEFAULT_FRAME_MAX,
    ) -> None:
        self.raw = raw
        self.url = url
        self.frame_max = frame_max

    @property
    def is_open(self) -> bool:
        return bool(self.raw.is_open)

    def channel(self) -> Channel:
        with _io():
            return Channel(self.raw.channel())

    def pump(self, seconds: float) -> None:
        """Run the I/O loop (and every callback due) for up to ``seconds``."""
        try:
            with headerguard.decoding():
                self.raw.process_data_events(time_limit=seconds)  # type: ignore[arg-type]
        except LOST as exc:
            raise ConnectionLost(describe(exc)) from exc

    def close(self) -> None:
        """Close if still open; a connection that is already broken is only forgotten."""
        try:
            if self.raw.is_open:
                with headerguard.decoding():  # deliveries may still arrive meanwhile
                    self.raw.close()
        except Exception:  # already dead: nothing to clean
            logger.debug("closing a broken connection failed", exc_info=True)


class Consuming:
    """What a consumer does on a channel: consume, settle, watch for cancels. Every call
    writes its frame (a blocking channel also waits for an RPC's answer); pika's errors
    become ours. Shared by :class:`Channel` and ``consuming.ConsumeChannel`` (a link's)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    @property
    def is_open(self) -> bool:
        return bool(self.raw.is_open)

    def on_cancelled(self, callback: Callable[[str], None]) -> None:
        """``callback(consumer_tag)`` when the broker cancels one of our consumers
        (``basic.cancel``: its queue was deleted, or the node holding it went away)."""
        self.raw.add_on_cancel_callback(lambda frame: callback(str(frame.method.consumer_tag)))

    def qos(self, prefetch: int) -> None:
        with _io():
            self.raw.basic_qos(prefetch_count=prefetch)

    def consume(self, queue: str, on_message: OnMessage) -> str:
        """Start consuming ``queue`` with manual acks; returns the consumer tag."""
        with _io():
            return str(self.raw.basic_consume(queue, delivering(on_message)))

    def cancel(self, consumer_tag: str) -> None:
        with _io():
            self.raw.basic_cancel(consumer_tag)

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        with _io():
            self.raw.basic_ack(delivery_tag, multiple=multiple)

    def nack(self, delivery_tag: int, requeue: bool = True) -> None:
        with _io():
            self.raw.basic_nack(delivery_tag, requeue=requeue)

    def reject(self, delivery_tag: int) -> None:
        """``basic.reject(requeue=True)``: unlike a nack, a quorum queue counts it (and its
        delayed retry holds it)."""
        with _io():
            self.raw.basic_reject(delivery_tag, requeue=True)


class Channel(Consuming):
    """A channel of a :class:`Connection`: declare, consume, settle (publishing goes through
    ``broker.window.ConfirmWindow`` on a link)."""

    def declare(self, the_plan: Plan) -> None:
        """Declare a topology plan; ``TopologyError`` names what conflicts (then drop us)."""
        with _io():
            declare(self.raw, the_plan)
