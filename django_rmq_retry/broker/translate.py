"""pika's exceptions translated into ours (``core.errors``), with one readable line each.

Everything above the broker package catches our types only: ``ConnectionLost`` (reconnect),
``ChannelClosed`` (the broker refused something on a channel, with its reply code),
``BrokerUnavailable``/``AccessRefused`` (cannot connect; the latter is not worth retrying).
A publish's answer (returned, nacked) comes through ``window.ConfirmWindow``'s callbacks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pika.exceptions as pex

from ..core.errors import ChannelClosed, ConnectionLost

#: pika's (and the socket's) errors after which a connection is gone and must be rebuilt.
LOST: tuple[type[BaseException], ...] = (
    pex.AMQPConnectionError,
    pex.ConnectionClosed,
    pex.StreamLostError,
    pex.ChannelWrongStateError,
    pex.ConnectionWrongStateError,
    pex.ChannelClosed,
    ConnectionError,
    OSError,
)


def describe(exc: BaseException) -> str:
    """A short human description of a pika error, never including credentials."""
    if isinstance(exc, pex.AMQPConnectionError) and exc.args:
        inner = exc.args[0]
        if isinstance(inner, BaseException):
            return describe(inner)
    # pika's connection workflow wraps the socket's error in its own exceptions that
    # carry it as `.exception` (one phase) or `.exceptions` (every attempt), and whose
    # str() is only their class name: the operating system's reason is inside.
    cause = getattr(exc, "exception", None)
    causes = getattr(exc, "exceptions", None) or ()
    if not isinstance(cause, BaseException) and causes:
        cause = causes[-1]
    if isinstance(cause, BaseException) and cause is not exc:
        return describe(cause)
    if isinstance(exc, pex.ChannelClosedByBroker | pex.ConnectionClosedByBroker):
        return f"{exc.reply_code} {exc.reply_text}"
    if "Connection refused" in str(exc) or isinstance(exc, ConnectionRefusedError):
        return "connection refused (is RabbitMQ running, on that host and port?)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]  # "name or service not known"
    return str(exc) or type(exc).__name__


#: Reply codes of a channel the broker closes for what one message carried: 403 (this login
#: may not write to that exchange), 406 (a ``user_id`` that is not the login, a message over
#: ``max_message_size``).
REFUSING_CHANNEL = frozenset({403, 406})
#: Reply codes of a connection the broker closes for what one message carried: frame errors
#: (501 ``frame_too_large``: properties larger than a frame), 502 syntax, 505 unexpected frame.
REFUSING_CONNECTION = frozenset({501, 502, 505})


def refusal(exc: BaseException | None) -> str | None:
    """Why the broker refused one message, if ``exc`` (a channel's or connection's closing
    reason) is such a refusal; ``None`` for anything else (an outage, a shutdown, a 404)."""
    if isinstance(exc, pex.ChannelClosedByBroker) and exc.reply_code in REFUSING_CHANNEL:
        return describe(exc)
    if isinstance(exc, pex.ConnectionClosedByBroker) and exc.reply_code in REFUSING_CONNECTION:
        return describe(exc)
    return None


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Run pika calls; raise their errors as ours (our own exceptions pass through)."""
    try:
        yield
    except pex.ChannelClosedByBroker as exc:
        raise ChannelClosed(exc.reply_code, exc.reply_text) from exc
    except LOST as exc:
        raise ConnectionLost(describe(exc)) from exc
