"""Links: pika connections driven by an event loop their owner runs, never waited on.

A :class:`Link` is one open pika connection on pika's public event-loop adapters: an
``AsyncioConnection`` on an asyncio loop (:func:`asyncio_link`: the consumer's loop, which
also runs ``async def`` receivers) or a ``SelectConnection`` on a pika ``IOLoop``
(:func:`select_link`: usable in any thread, one that runs an asyncio loop included).
Several links share one loop (the ``custom_ioloop`` they are given), so one thread carries
a consumer's deliveries, its retry copies and both heartbeats without waiting on either.

Everything here is callbacks: connecting tries ``BROKER_URLS`` in failover order
(``core.failover``) and hands ``on_done`` a link or the error ``broker.connection.connect``
would raise (``AccessRefused`` stops the round, ``BrokerUnavailable`` moves to the next URL,
with the same texts). Why a link or one of its channels closed comes from pika's close
callbacks, so nothing reads pika's internals. The owner runs the loop inside
``headerguard.decoding()``: pika decodes the properties of deliveries in these callbacks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import pika.exceptions as pex
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.select_connection import IOLoop, SelectConnection
from pika.adapters.utils import connection_workflow as workflow

from ..conf import broker_urls
from ..core.errors import AccessRefused, BrokerUnavailable
from ..core.failover import connect_order
from . import headerguard
from .connection import connection_parameters, mask_url
from .translate import describe

logger = logging.getLogger("django_rmq_retry.broker")

#: ``on_done(link)`` once a link is open, or ``on_done(error)`` when none could be.
OnLink = Callable[["Link | Exception"], None]
#: Tries of ``Link.close`` at most (one per consumer on pika 1.4.0; see there).
_CLOSE_TRIES = 10_000


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Time on an event loop: what a state machine on the loop needs to wait without
    blocking it (a stall timer, a pause between two steps). A test drives a fake one."""

    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the loop after ``delay`` seconds, unless cancelled first."""
        ...

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        """From any thread: run ``callback`` on the loop soon."""
        ...


class AsyncioClock:
    """A :class:`Clock` on an asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def now(self) -> float:
        return self.loop.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.loop.call_later(delay, callback)

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(callback)


class _SelectTimer:
    __slots__ = ("handle", "ioloop")

    def __init__(self, ioloop: IOLoop, handle: Any) -> None:
        self.ioloop = ioloop
        self.handle = handle

    def cancel(self) -> None:
        self.ioloop.remove_timeout(self.handle)


class SelectClock:
    """A :class:`Clock` on a pika ``IOLoop`` (it keeps time with ``time.monotonic``)."""

    def __init__(self, ioloop: IOLoop) -> None:
        self.ioloop = ioloop

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return _SelectTimer(self.ioloop, self.ioloop.call_later(delay, callback))

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        self.ioloop.add_callback_threadsafe(callback)


class Link:
    """One open connection to ``url`` on its owner's loop (``clock``).

    ``blocked`` is True while the broker blocks the connection's publishes (a memory or disk
    alarm); ``close_reason`` is why it closed (pika's exception, from its close callback),
    ``None`` while open. Listeners added with :meth:`on_blocked` and :meth:`on_closed` run on
    the loop, in the order they were added.
    """

    def __init__(self, raw: Any, url: str, clock: Clock) -> None:
        self.raw = raw
        self.url = url
        self.clock = clock
        self.blocked = False
        self.blocked_reason = ""
        self.close_reason: BaseException | None = None
        self._blocked_listeners: list[Callable[[bool, str], None]] = []
        self._closed_listeners: list[Callable[[BaseException], None]] = []
        raw.add_on_connection_blocked_callback(self._on_blocked)
        raw.add_on_connection_unblocked_callback(self._on_unblocked)
        raw.add_on_close_callback(self._on_closed)

    @property
    def is_open(self) -> bool:
        return bool(self.raw.is_open)

    @property
    def frame_max(self) -> int:
        """The largest frame this connection may send: the smaller of what its parameters
        asked for and what the broker allows (negotiated when it opened)."""
        return int(self.raw.params.frame_max)

    @property
    def closed_why(self) -> str:
        """Why the link closed, in one readable line ("" while it is open)."""
        return "" if self.close_reason is None else describe(self.close_reason)

    def on_blocked(self, listener: Callable[[bool, str], None]) -> None:
        """``listener(blocked, reason)`` when the broker blocks (a memory or disk alarm) or
        unblocks this connection's publishes."""
        self._blocked_listeners.append(listener)

    def on_closed(self, listener: Callable[[BaseException], None]) -> None:
        """``listener(reason)`` once the connection closed, whoever closed it: ``reason``
        is pika's exception (``translate.describe`` reads it, ``translate.refusal`` says
        whether the broker closed it over what one message carried)."""
        self._closed_listeners.append(listener)

    def channel(
        self,
        on_open: Callable[[Any], None],
        on_close: Callable[[Any, BaseException], None],
    ) -> Any:
        """Open a channel: ``on_open(channel)`` once it is open, ``on_close(channel,
        reason)`` when it closes (the broker closed it, we did, or its connection went:
        then ``reason`` is the connection's). Returns pika's channel object at once."""
        channel = self.raw.channel(on_open_callback=on_open)
        channel.add_on_close_callback(on_close)
        return channel

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        """From any thread: run ``callback`` on the link's loop."""
        self.clock.call_soon_threadsafe(callback)

    def close(self) -> None:
        """Close the connection if it is open; the close listeners run once it is closed."""
        # pika 1.4.0's Channel.close() cancels a channel's consumers while iterating over
        # them: it raises RuntimeError after cancelling the first (pika 1.4.4 copies the
        # keys). Each try cancels one more, so a consuming connection closes after at most
        # one try per consumer.
        for _try in range(_CLOSE_TRIES):
            if not self.raw.is_open:
                return
            try:
                self.raw.close()
                return
            except RuntimeError:
                continue
        raise RuntimeError(f"pika did not close the connection in {_CLOSE_TRIES} tries")

    def _on_blocked(self, *args: Any) -> None:
        # pika calls it with (connection, method_frame), whatever its annotations say.
        self.blocked = True
        self.blocked_reason = str(getattr(args[-1].method, "reason", "") or "")
        for listener in list(self._blocked_listeners):
            listener(True, self.blocked_reason)

    def _on_unblocked(self, *_args: Any) -> None:
        self.blocked = False
        self.blocked_reason = ""
        for listener in list(self._blocked_listeners):
            listener(False, "")

    def _on_closed(self, _raw: Any, reason: BaseException) -> None:
        self.close_reason = reason
        self.blocked = False
        for listener in list(self._closed_listeners):
            listener(reason)


def connect_error(url: str, exc: BaseException | str) -> Exception:
    """What connecting to ``url`` failed with, as ours: the texts of
    ``connection.connect``, so a log or an operator reads the same line whichever adapter
    tried. Anything unknown (a mistake in the URL's options) is passed on as it is."""
    if isinstance(exc, workflow.AMQPConnectionWorkflowFailed) and exc.exceptions:
        exc = exc.exceptions[-1]  # the last attempt's error, as BlockingConnection raises
    if isinstance(exc, workflow.AMQPConnectorPhaseErrorBase) and not isinstance(
        exc, workflow.AMQPConnectorSocketConnectError
    ):
        exc = exc.exception  # the TLS or AMQP handshake's own error
    if isinstance(exc, str):  # pika hands some workflow failures over as text
        return BrokerUnavailable(f"cannot reach RabbitMQ at {mask_url(url)}: {exc}")
    if isinstance(exc, pex.ProbableAuthenticationError):
        return AccessRefused(
            f"RabbitMQ at {mask_url(url)} refused the login (check user and password)"
        )
    if isinstance(exc, pex.ProbableAccessDeniedError):
        return AccessRefused(f"RabbitMQ at {mask_url(url)} denied access to the virtual host")
    if isinstance(exc, pex.AMQPConnectionError | OSError | workflow.AMQPConnectorException):
        return BrokerUnavailable(f"cannot reach RabbitMQ at {mask_url(url)}: {describe(exc)}")
    return exc if isinstance(exc, Exception) else RuntimeError(repr(exc))


class _Connecting:
    """One round over the URLs, each tried once, until one opens (see :func:`asyncio_link`)."""

    def __init__(
        self,
        make: Callable[..., Any],
        ioloop: Any,
        clock: Clock,
        urls: list[str],
        on_done: OnLink,
        overrides: dict[str, Any],
    ) -> None:
        self.make = make
        self.ioloop = ioloop
        self.clock = clock
        self.urls = urls
        self.on_done = on_done
        self.overrides = overrides
        self.index = 0

    def start(self) -> None:
        url = self.urls[self.index]
        try:
            params = connection_parameters(url, **self.overrides)
            self.make(
                parameters=params,
                on_open_callback=self._opened,
                on_open_error_callback=self._failed,
                custom_ioloop=self.ioloop,
            )
        except Exception as exc:  # refused while building (TLS files...): this URL fails
            self._failed(None, exc)

    def _opened(self, raw: Any) -> None:
        self.on_done(Link(raw, self.urls[self.index], self.clock))

    def _failed(self, _raw: Any, error: BaseException | str) -> None:
        url = self.urls[self.index]
        exc = connect_error(url, error)
        last = self.index == len(self.urls) - 1
        if last or not isinstance(exc, BrokerUnavailable) or isinstance(exc, AccessRefused):
            # A refused login ends the round: every node of a cluster shares its users.
            self.on_done(exc)
            return
        self.index += 1
        logger.warning("%s; trying %s", exc, mask_url(self.urls[self.index]))
        self.start()


def _connect(
    make: Callable[..., Any],
    ioloop: Any,
    clock: Clock,
    on_done: OnLink,
    url: str | None,
    after: str | None,
    overrides: dict[str, Any],
) -> None:
    headerguard.install()  # on first use, as for blocking connections
    urls = [url] if url else connect_order(broker_urls(), after)
    _Connecting(make, ioloop, clock, urls, on_done, overrides).start()


def asyncio_link(
    loop: asyncio.AbstractEventLoop,
    on_done: OnLink,
    *,
    url: str | None = None,
    after: str | None = None,
    **overrides: Any,
) -> None:
    """Open a link on the asyncio ``loop``; ``on_done(link_or_error)`` runs on the loop.

    Without ``url`` the URLs of ``BROKER_URLS`` are tried in turn, starting after ``after``
    (the URL whose connection was just lost), as ``connection.connect`` does; ``overrides``
    are its too (``name``, ``blocked_connection_timeout``...). The loop is always passed to
    pika explicitly: its default lookup differs between versions. Call it on the loop's
    thread, with the loop running or about to run.
    """
    _connect(AsyncioConnection, loop, AsyncioClock(loop), on_done, url, after, overrides)


def select_link(
    ioloop: IOLoop,
    on_done: OnLink,
    *,
    url: str | None = None,
    after: str | None = None,
    services: Any = None,
    **overrides: Any,
) -> None:
    """Open a link on the pika ``ioloop`` (see :func:`asyncio_link`); ``services`` are pika
    I/O services over that loop to use instead of pika's default ones
    (``joining.JoiningServices``)."""
    make, clock = SelectConnection, SelectClock(ioloop)
    _connect(make, services or ioloop, clock, on_done, url, after, overrides)


def new_ioloop() -> IOLoop:
    """A pika ``IOLoop`` for :func:`select_link` (its thread runs ``start()``)."""
    return IOLoop()


__all__ = [
    "AsyncioClock",
    "Clock",
    "Link",
    "SelectClock",
    "Timer",
    "asyncio_link",
    "connect_error",
    "new_ioloop",
    "select_link",
]
