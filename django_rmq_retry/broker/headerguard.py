"""Header tables on our connections: read as the values they encode, and never fatal.

pika decodes content headers inside the connection's I/O, with a decoder of its own that
loses values and raises on others. It reads AMQP floats and doubles as integers (a Java
client's ``ratio = 2.5`` arrives as ``2``), and it raises on what Python cannot hold: a
timestamp before 1970 or after 9999 (Java and Go clients write any date as a signed 64-bit
count), tables nested thousands of levels deep, a field type it does not know. Raised there,
such a message killed the connection and came back at the head of the queue on every
reconnect: a crash loop no receiver code could stop, with every message behind it stuck.

So on our connections the header table of each message's properties is decoded by
``core.amqptable.decode`` instead: every field type as the value it encodes, the same on
every pika version. A table it cannot read becomes an ``UndecodableHeaders`` table
``{UNDECODABLE_HEADERS: reason, RAW_HEADERS: the table's bytes}`` (its length prefix lets
us skip it), and the consumer parks the message as undecodable with those bytes kept. The
reason names the value: ``header 'meta' > 'at': timestamp ... out of range``. A table read
becomes a ``RawHeaders`` that keeps its bytes, so our copies send the sender's entries as
they came.

Only our own deliveries are decoded so. The wrapper is put in place the first time one of our
connections is opened (never at import), and it hands every call to pika's own decoder
unless the calling thread is inside :func:`decoding` — which our connections set around
their I/O (a pika connection belongs to one thread, and reads only inside its calls). Any
other pika code in the process, before or after ours ran, decodes exactly as pika does.

pika offers no public way to choose a connection's table decoder, so this is the one module
that reaches into pika for it (``pika.spec.data``, see :func:`guard_table_decoding`),
feature-detected on the running pika and reported once at the consumer's start-up
(:func:`log_features`: ``pika 1.4.4: header guard on``, at WARNING when off, so production
learns when a pika upgrade turned it off). Tested on the oldest and the newest pika
``pyproject.toml`` allows.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.data
import pika.spec

from ..core import amqptable
from ..core.envelope import UNDECODABLE_HEADERS, RawHeaders, UndecodableHeaders
from ..core.undecodable import RAW_HEADERS


class _Scope(threading.local):
    depth = 0


_scope = _Scope()


@contextlib.contextmanager
def decoding() -> Iterator[None]:
    """Header tables this thread decodes meanwhile are guarded (our connection's I/O)."""
    _scope.depth += 1
    try:
        yield
    finally:
        _scope.depth -= 1


#: Marks our wrapper of pika's table decoding module (so it is put in place once).
_MARK = "_rmq_retry_guard"
_lock = threading.Lock()

logger = logging.getLogger("django_rmq_retry.broker")
#: Whether the guard could be put in place in this process (None: not tried yet).
_on: bool | None = None
_logged = False


def pika_version() -> str:
    return str(getattr(pika, "__version__", "?"))


def state() -> bool | None:
    """Whether the guard is on in this process (None: no connection of ours opened yet)."""
    return _on


def log_features() -> None:
    """Log once per process whether the guard is on (the consumer calls it at start-up):
    at INFO, or at WARNING when this pika could not be wrapped."""
    global _logged
    with _lock:
        if _logged:
            return
        _logged = True
        on = _on
    word = "?" if on is None else "on" if on else "off"
    level = logging.WARNING if on is False else logging.INFO
    logger.log(level, "pika %s: header guard %s", pika_version(), word)


def installed() -> bool:
    """Whether the wrapper is in place (after our first connection)."""
    return table_decoding_guarded()


def install() -> bool:
    """Wrap the header-table decoder pika uses for properties (idempotent); False if this
    pika cannot be wrapped (then pika's own decoding stays, unguarded).

    Outside :func:`decoding` the wrapper calls pika's own decoder and nothing else.
    """

    def make(original: Any) -> Any:
        def decode_table(encoded: bytes, offset: int) -> tuple[dict[str, Any], int]:
            if not _scope.depth:  # not one of our connections: pika's own behaviour
                return original(encoded, offset)
            return guarded_decode(encoded, offset)

        return decode_table

    return guard_table_decoding(make)


def guard_table_decoding(make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Have pika's properties decode header tables with ``make(pika's decode_table)``.

    pika's ``spec`` module decodes tables through its module global ``data``; that global
    (not pika's ``data`` module itself) is pointed at a copy whose ``decode_table`` is ours.
    Idempotent; False (and pika untouched) if ``spec`` is not shaped so.
    """
    with _lock:
        current = getattr(pika.spec, "data", None)
        on = bool(getattr(current, _MARK, False))
        data: Any = pika.data
        unchanged = current is pika.data  # (not narrowing ``data``: it stays a module)
        if not on and unchanged and callable(getattr(data, "decode_table", None)):
            guarded = types.ModuleType(data.__name__)
            guarded.__dict__.update(vars(data))
            guarded.decode_table = make(data.decode_table)  # type: ignore[attr-defined]
            setattr(guarded, _MARK, True)
            pika.spec.data = guarded  # type: ignore[attr-defined]
            on = True
        global _on
        if _on is None or not on:  # once off, it says off
            _on = on
    return on


def table_decoding_guarded() -> bool:
    return bool(getattr(getattr(pika.spec, "data", None), _MARK, False))


def guarded_decode(encoded: bytes, offset: int) -> tuple[dict[Any, Any], int]:
    """The table at ``offset`` of ``encoded`` as the values it encodes (``amqptable``), or
    an :class:`UndecodableHeaders` table instead of raising; and where the table ends."""
    end = offset + 4 + struct.unpack_from(">I", encoded, offset)[0]
    raw = encoded[offset:end]
    try:
        table = amqptable.decode(raw)
    except amqptable.BadValue as bad:
        what = f"header {_where(bad.path)}: {bad.what}"
    except amqptable.BadTable:  # an inner length ran past the table: the rest is garbage
        what = "their lengths disagree"
    else:
        # Our copies re-send the sender's entries as these bytes (``core.envelope.RawHeaders``).
        return RawHeaders(table, raw=raw), end
    reason = f"headers cannot be decoded: {what}"
    return UndecodableHeaders({UNDECODABLE_HEADERS: reason[:300], RAW_HEADERS: raw}), end


def _where(path: tuple[str, ...]) -> str:
    """``'meta' > 'at'``, ``'dates' [1]``; a long path keeps its two ends."""
    if len(path) > 8:
        return f"{_where(path[:3])} > … ({len(path)} levels) > {_where(path[-2:])}"
    text = ""
    for part in path:
        text += f" {part}" if part.startswith("[") else (f" > {part}" if text else part)
    return text
