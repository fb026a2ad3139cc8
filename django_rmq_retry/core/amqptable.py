"""An AMQP 0-9-1 field table as bytes: cut into entries and put back, nothing decoded.

A table is a 32-bit length and then (short-string key, typed value) pairs. A client library
turns values into its language's types and back, and loses what those types cannot say:
a decimal's exponent, an integer's width and signedness, a float's single precision. Our
copies of a message (retry, park, requeue) must carry what the sender wrote, so they keep
each foreign entry's bytes as they arrived and splice in only our own headers. The sizes of
every field type RabbitMQ accepts are fixed by the type octet (or a length prefix), so an
entry can be cut out without decoding its value.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

#: Value sizes of the fixed-width field types (RabbitMQ's table types, AMQP 0-9-1 errata).
_FIXED = {
    b"t": 1,  # boolean
    b"b": 1,  # signed 8
    b"B": 1,  # unsigned 8
    b"s": 2,  # signed 16 (RabbitMQ's letter)
    b"u": 2,  # unsigned 16
    b"U": 2,  # signed 16 (the spec's letter)
    b"I": 4,  # signed 32
    b"i": 4,  # unsigned 32
    b"l": 8,  # signed 64
    b"L": 8,  # unsigned 64 (the spec's letter)
    b"f": 4,  # float
    b"d": 8,  # double
    b"D": 5,  # decimal: scale octet + signed 32
    b"T": 8,  # timestamp
    b"V": 0,  # void
}
#: Field types whose value is a 32-bit length and that many bytes.
_SIZED = frozenset({b"S", b"x", b"F", b"A"})
_U32 = struct.Struct(">I")


class BadTable(ValueError):
    """Bytes that are not one well-formed field table (lengths disagree, unknown type)."""


def table_key(raw: bytes) -> str | bytes:
    """A key as a client reads it: text when it is UTF-8, else its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def entries(table: bytes) -> dict[str | bytes, bytes]:
    """Each entry of ``table`` (its length prefix included) by key, as its bytes (key and
    typed value), in the table's order. A key given twice keeps its last entry, as clients
    decoding into a map do. Raises :class:`BadTable`."""
    if len(table) < 4:
        raise BadTable("shorter than its length")
    (size,) = _U32.unpack_from(table, 0)
    if size != len(table) - 4:
        raise BadTable("its length disagrees with its bytes")
    found: dict[str | bytes, bytes] = {}
    for key, start, end in _walk(table, 4, len(table)):
        found.pop(key, None)
        found[key] = table[start:end]
    return found


def _walk(data: bytes, pos: int, end: int) -> Iterator[tuple[str | bytes, int, int]]:
    while pos < end:
        start = pos
        length = data[pos]
        key = table_key(data[pos + 1 : pos + 1 + length])
        pos += 1 + length
        if pos >= end:
            raise BadTable("an entry without a value")
        pos = _skip_value(data, pos, end)
        yield key, start, pos


def _skip_value(data: bytes, pos: int, end: int) -> int:
    kind = data[pos : pos + 1]
    pos += 1
    if kind in _FIXED:
        pos += _FIXED[kind]
    elif kind in _SIZED:
        if pos + 4 > end:
            raise BadTable("a length past the table's end")
        (size,) = _U32.unpack_from(data, pos)
        pos += 4 + size
    else:
        raise BadTable(f"unknown field type {kind!r}")
    if pos > end:
        raise BadTable("a value past the table's end")
    return pos


def join(pieces: list[bytes]) -> bytes:
    """A table of entries already encoded (key and typed value each)."""
    data = b"".join(pieces)
    return _U32.pack(len(data)) + data


__all__ = ["BadTable", "entries", "join", "table_key"]
