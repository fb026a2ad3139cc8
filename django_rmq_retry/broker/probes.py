"""Questions ``manage.py rmq_doctor`` asks the broker, over AMQP only (the management plugin
may be off or out of reach), each on a channel of its own so that a refusal closes nothing
else, and none of them touching a message:

* :func:`server_version`: what the broker said it is when the connection opened;
* :func:`may_publish`: a mandatory publish, with confirms, of an empty message under a
  routing key nothing binds: the broker returns it (write permission granted) or closes
  the channel (403). It reaches no queue;
* :func:`may_bind`: a binding made again exactly as it is (write on the queue, read on the
  exchange);
* :func:`may_configure`: an existing exchange declared again as it is (configure);
* :func:`drifted`: each exchange and queue of a plan declared again with the code's
  arguments: missing (404 on a passive declare) or different (406 names the argument).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pika.exceptions as pex
from pika.exchange_type import ExchangeType

from ..core.errors import BrokerUnavailable
from ..core.topology_plan import Plan
from .connection import Connection
from .links import Link, asyncio_link

#: Seconds to open the connection :func:`server_version` reads the version from.
VERSION_TIMEOUT = 30.0


def server_version(url: str | None = None) -> str:
    """The version the broker announces in ``connection.start`` (``server_properties``),
    read from a short-lived link on an event loop of its own."""
    loop = asyncio.new_event_loop()
    try:
        opened: asyncio.Future[Link | Exception] = loop.create_future()

        def done(result: Link | Exception) -> None:
            if not opened.done():
                opened.set_result(result)

        asyncio_link(loop, done, url=url, name="django-rmq-retry doctor")
        try:
            result = loop.run_until_complete(asyncio.wait_for(opened, VERSION_TIMEOUT))
        except asyncio.TimeoutError:
            raise BrokerUnavailable(f"no answer from RabbitMQ in {VERSION_TIMEOUT:.0f}s") from None
        if isinstance(result, Exception):
            raise result
        props: dict[str, Any] = result.raw.server_properties or {}
        version = props.get("version", b"")
        result.close()
        loop.run_until_complete(_closed(result))
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        loop.close()


async def _closed(link: Link) -> None:
    for _ in range(200):
        if link.close_reason is not None:
            return
        await asyncio.sleep(0.01)


@contextmanager
def _own_channel(conn: Connection) -> Iterator[Any]:
    channel = conn.raw.channel()
    try:
        yield channel
    finally:
        if channel.is_open:
            channel.close()


def _refusal(exc: pex.ChannelClosedByBroker) -> str:
    return f"{exc.reply_code} {exc.reply_text}"


def may_publish(conn: Connection, exchange: str, routing_key: str) -> str | None:
    """``None`` if this user may publish to ``exchange``, else the broker's refusal. The
    probe is returned unroutable (``routing_key`` must be one nothing binds)."""
    with _own_channel(conn) as channel:
        channel.confirm_delivery()
        try:
            channel.basic_publish(exchange, routing_key, b"", mandatory=True)
        except pex.UnroutableError:
            return None  # allowed, and returned as it should be
        except pex.ChannelClosedByBroker as exc:
            return _refusal(exc)
    return None


def may_bind(conn: Connection, queue: str, exchange: str, routing_key: str) -> str | None:
    """``None`` if this user may bind ``queue`` to ``exchange`` (the binding exists: made
    again, nothing changes), else the broker's refusal."""
    with _own_channel(conn) as channel:
        try:
            channel.queue_bind(queue, exchange, routing_key=routing_key)
        except pex.ChannelClosedByBroker as exc:
            return _refusal(exc)
    return None


def may_configure(conn: Connection, exchange: str, kind: str, args: dict[str, Any]) -> str | None:
    """``None`` if this user may declare ``exchange`` (it exists with ``kind`` and
    ``args``: declared again, nothing changes), else the broker's refusal."""
    with _own_channel(conn) as channel:
        try:
            channel.exchange_declare(exchange, ExchangeType(kind), durable=True, arguments=args)
        except pex.ChannelClosedByBroker as exc:
            return _refusal(exc)
    return None


def drifted(conn: Connection, the_plan: Plan, *, compare: bool = True) -> list[tuple[str, str]]:
    """``(object, what)`` for each exchange or queue of ``the_plan`` that is missing or
    (``compare``) exists with other arguments than the code declares. Comparing needs
    configure permission: the arguments are compared by declaring again (AMQP cannot read
    them), which changes nothing for an object that exists as declared."""
    out: list[tuple[str, str]] = []
    for name, kind, args in the_plan.exchanges:
        what = _declared_again(
            conn,
            lambda ch, passive, n=name, k=kind, a=args: ch.exchange_declare(
                n, ExchangeType(k), passive=passive, durable=True, arguments=a or None
            ),
            compare,
        )
        if what:
            out.append((f"exchange {name!r}", what))
    for q in the_plan.queues:
        what = _declared_again(
            conn,
            lambda ch, passive, q=q: ch.queue_declare(
                q.name, passive=passive, durable=True, arguments=q.arguments or None
            ),
            compare,
        )
        if what:
            out.append((f"queue {q.name!r}", what))
    return out


def _declared_again(conn: Connection, declare: Any, compare: bool) -> str:
    """ "" if the object exists (as declared, with ``compare``); else "missing" or the
    broker's refusal (a 406 names the argument that differs)."""
    with _own_channel(conn) as channel:
        try:
            declare(channel, True)
        except pex.ChannelClosedByBroker as exc:
            return "missing" if exc.reply_code == 404 else _refusal(exc)
    if not compare:
        return ""
    with _own_channel(conn) as channel:
        try:
            declare(channel, False)
        except pex.ChannelClosedByBroker as exc:
            return _refusal(exc)
    return ""
