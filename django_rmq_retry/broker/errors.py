"""pika's exceptions translated into ours (``core.errors``), with one readable line each.

Everything above the broker package catches our types only: ``ConnectionLost`` (reconnect),
``ChannelClosed`` (the broker refused something on a channel, with its reply code),
``BrokerUnavailable``/``AccessRefused`` (cannot connect; the latter is not worth retrying),
``UnroutableError``/``NackedError`` (a confirmed publish the broker did not store).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pika.exceptions as pex

from ..core.errors import ChannelClosed, ConnectionLost, NackedError, UnroutableError

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


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Run pika calls; raise their errors as ours (our own exceptions pass through)."""
    try:
        yield
    except pex.ChannelClosedByBroker as exc:
        raise ChannelClosed(exc.reply_code, exc.reply_text) from exc
    except pex.UnroutableError as exc:
        raise UnroutableError("the message was returned as unroutable") from exc
    except pex.NackError as exc:
        raise NackedError("the broker refused (nacked) the message") from exc
    except LOST as exc:
        raise ConnectionLost(describe(exc)) from exc
