"""Make pika survive header tables it cannot decode.

Another client can publish headers pika cannot turn into Python values: a timestamp before
1970 or after 9999 (Java and Go clients write any date as a signed 64-bit count), tables
nested thousands of levels deep, a field type pika does not know. pika decodes content
headers inside the connection's I/O, so such a message raised there, killed the connection,
and came back at the head of the queue on every reconnect: a crash loop no receiver code
could stop, with every message behind it stuck.

The top-level table decode used for properties is wrapped. A table pika refuses — whatever
it raises — becomes an ``UndecodableHeaders`` table ``{UNDECODABLE_HEADERS: reason,
RAW_HEADERS: the table's bytes}`` (its length prefix lets us skip it), and the consumer parks the message as undecodable with those
bytes kept. The reason names the value: ``header 'meta' > 'at': timestamp ... out of range``.
So does a table pika decodes into a value it could never encode again (a huge double).

Only our own deliveries are guarded. The wrapper is put in place the first time one of our
connections is opened (never at import), and it hands every call to pika's own decoder
unless the calling thread is inside :func:`decoding` — which our connections set around
their I/O (a pika connection belongs to one thread, and reads only inside its calls). Any
other pika code in the process, before or after ours ran, decodes exactly as pika does.
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pika.data

from ..core.envelope import UNDECODABLE_HEADERS, RawHeaders, UndecodableHeaders
from ..core.undecodable import RAW_HEADERS
from . import pikaext

#: How deep the search for the culprit goes before it says "nested too deeply".
_MAX_DEPTH = 32

_KINDS = {
    b"T": "timestamp",
    b"F": "table",
    b"A": "array",
    b"D": "decimal",
    b"d": "double",
    b"f": "float",
    b"S": "long string",
    b"x": "byte array",
}


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


def installed() -> bool:
    """Whether the wrapper is in place (after our first connection)."""
    return pikaext.table_decoding_guarded()


def install() -> bool:
    """Wrap the header-table decoder pika uses for properties (idempotent); False if this
    pika cannot be wrapped (``pikaext``: then pika's own decoding stays, unguarded).

    Outside :func:`decoding` the wrapper calls pika's own decoder and nothing else.
    """

    def make(original: Any) -> Any:
        def decode_table(encoded: bytes, offset: int) -> tuple[dict[str, Any], int]:
            if not _scope.depth:  # not one of our connections: pika's own behaviour
                return original(encoded, offset)
            return guarded_decode(original, encoded, offset)

        return decode_table

    return pikaext.guard_table_decoding(make)


def guarded_decode(original: Any, encoded: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """``original(encoded, offset)``, or an :class:`UndecodableHeaders` table instead of
    raising (or of a value that could never be sent again)."""
    end = offset + 4 + struct.unpack_from(">I", encoded, offset)[0]
    try:
        table, stop = original(encoded, offset)
    except Exception as exc:  # any refusal: a parked message, never a dead connection
        return _undecodable(encoded, offset, end, exc), end
    if stop != end:  # an inner length ran past the table: what follows would be garbage
        reason = "headers cannot be decoded: their lengths disagree"
        return UndecodableHeaders(
            {UNDECODABLE_HEADERS: reason, RAW_HEADERS: encoded[offset:end]}
        ), end
    if table and (oversized := _oversized(table)) is not None:
        reason = f"headers cannot be decoded: {oversized}"
        return UndecodableHeaders(
            {UNDECODABLE_HEADERS: reason, RAW_HEADERS: encoded[offset:end]}
        ), end
    # Our copies re-send the sender's entries as these bytes (``core.envelope.RawHeaders``).
    return RawHeaders(table, raw=encoded[offset:end]), stop


def _oversized(table: dict[Any, Any]) -> str | None:
    """A value pika decoded but can never send again, named by its path, or None.

    pika reads AMQP doubles and floats as integers (``int(value)``): ``1.8e308`` becomes a
    309-digit integer that no AMQP integer type holds, so the retry copy of that message
    would fail to encode inside the connection's I/O and take the consumer down.
    """
    stack: list[tuple[Any, tuple[str, ...]]] = [(table, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, (*path, repr(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*path, f"[{i}]")) for i, v in enumerate(value))
        elif isinstance(value, int) and not -(2**63) <= value < 2**63:
            return (
                f"header {_where(path)}: a double or float pika reads as the integer "
                f"{value:.3e}, outside AMQP's 64-bit range (it could not be sent again)"
            )
    return None


def _undecodable(encoded: bytes, offset: int, end: int, exc: BaseException) -> UndecodableHeaders:
    try:
        found = _culprit(encoded, offset + 4, end, False, ())
    except Exception:  # a table too broken to walk: say what pika said
        found = None
    if found is None:
        what = (
            "headers nested too deeply to decode"
            if isinstance(exc, RecursionError)
            else f"headers cannot be decoded ({type(exc).__name__}: {exc})"
        )
    else:
        what = f"headers cannot be decoded: {found}"
    return UndecodableHeaders({UNDECODABLE_HEADERS: what[:300], RAW_HEADERS: encoded[offset:end]})


def _culprit(
    encoded: bytes, offset: int, end: int, array: bool, path: tuple[str, ...]
) -> str | None:
    """The first value in a table (or array) pika fails on, named by its path, or None."""
    index = 0
    while offset < end:
        here = path
        if array:
            here = (*path, f"[{index}]")
        else:
            key, offset = pika.data.decode_short_string(encoded, offset)
            here = (*path, repr(key))
        kind = encoded[offset : offset + 1]
        try:
            _value, after = pika.data.decode_value(encoded, offset)
        except Exception as exc:
            if kind in (b"F", b"A"):
                if len(here) >= _MAX_DEPTH:
                    return f"header {_where(here)}: nested too deeply to decode"
                size = struct.unpack_from(">I", encoded, offset + 1)[0]
                inner = _culprit(encoded, offset + 5, offset + 5 + size, kind == b"A", here)
                if inner is not None:
                    return inner
            return f"header {_where(here)}: {_describe(encoded, offset, kind, exc)}"
        offset = after
        index += 1
    return None


def _where(path: tuple[str, ...]) -> str:
    """``'meta' > 'at'``, ``'dates' [1]``; a long path keeps its two ends."""
    if len(path) > 8:
        return f"{_where(path[:3])} > … ({len(path)} levels) > {_where(path[-2:])}"
    text = ""
    for part in path:
        text += f" {part}" if part.startswith("[") else (f" > {part}" if text else part)
    return text


def _describe(encoded: bytes, offset: int, kind: bytes, exc: BaseException) -> str:
    name = _KINDS.get(kind, f"field type {kind!r}")
    if kind == b"T":
        seconds = struct.unpack_from(">Q", encoded, offset + 1)[0]
        signed = struct.unpack_from(">q", encoded, offset + 1)[0]
        value = f"{seconds}" + (f" (signed: {signed})" if signed < 0 else "")
        return f"timestamp {value} seconds is out of the range Python dates can hold"
    return f"{name} value cannot be decoded ({type(exc).__name__}: {exc})"
