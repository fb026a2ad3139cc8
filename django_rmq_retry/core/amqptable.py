"""An AMQP 0-9-1 field table as bytes: cut into entries and put back, and read as values.

A table is a 32-bit length and then (short-string key, typed value) pairs. A client library
turns values into its language's types and back, and loses what those types cannot say:
a decimal's exponent, an integer's width and signedness, a float's single precision. Our
copies of a message (retry, park, requeue) must carry what the sender wrote, so they keep
each foreign entry's bytes as they arrived and splice in only our own headers. The sizes of
every field type RabbitMQ accepts are fixed by the type octet (or a length prefix), so an
entry can be cut out without decoding its value (:func:`entries`).

A receiver reads the values (:func:`decode`): each one as the Python value its type
encodes, a float as a float, a decimal with its exponent, a timestamp as an aware UTC
datetime. pika's own decoder turns AMQP floats and doubles into integers (``2.5`` arrives as
``2``), so our connections decode header tables here instead (``broker.headerguard``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

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
    b"L": 8,  # 64 bits (the spec says unsigned; RabbitMQ and pika read it signed)
    b"f": 4,  # float
    b"d": 8,  # double
    b"D": 5,  # decimal: scale octet + signed 32
    b"T": 8,  # timestamp
    b"V": 0,  # void
}
#: Field types whose value is a 32-bit length and that many bytes.
_SIZED = frozenset({b"S", b"x", b"F", b"A"})
_U32 = struct.Struct(">I")


#: How deep tables and arrays may nest in a table :func:`decode` reads (the top is 0).
MAX_DEPTH = 100


class BadTable(ValueError):
    """Bytes that are not one well-formed field table (lengths disagree, unknown type)."""


class BadValue(BadTable):
    """A value :func:`decode` cannot turn into a Python value, and where it is.

    ``path`` leads to it from the top table: each key as its ``repr``, each array position
    as ``[i]``; ``what`` says what is wrong with it."""

    def __init__(self, what: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(what)
        self.what = what
        self.path = path


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


# Values ----------------------------------------------------------------------------------
#: Numbers by type octet. ``L`` is signed, as RabbitMQ and pika read it (the 0-9-1 errata);
#: ``s`` and ``U`` are both signed 16 (RabbitMQ's letter and the spec's).
_NUMBERS = {
    b"b": struct.Struct(">b"),
    b"B": struct.Struct(">B"),
    b"s": struct.Struct(">h"),
    b"U": struct.Struct(">h"),
    b"u": struct.Struct(">H"),
    b"I": struct.Struct(">i"),
    b"i": struct.Struct(">I"),
    b"l": struct.Struct(">q"),
    b"L": struct.Struct(">q"),
    b"f": struct.Struct(">f"),
    b"d": struct.Struct(">d"),
}
_DECIMAL = struct.Struct(">Bi")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def decode(table: bytes) -> dict[str | bytes, Any]:
    """The values of ``table`` (its length prefix included), by key, in the table's order.

    Each value is what its type encodes: ``t`` a bool; the integer types an int; ``f`` and
    ``d`` a float (the single's exact value, NaN and infinities too); ``D`` a
    ``Decimal`` with the sender's exponent (``Decimal("1.50")``); ``T`` an aware UTC
    datetime (seconds since 1970, unsigned as RabbitMQ reads it); ``S`` text when it is
    UTF-8, else bytes; ``x`` bytes; ``F`` a dict, ``A`` a list, ``V`` None. Keys as
    :func:`table_key`. A key given twice keeps its last value, at its last place (as
    :func:`entries`). Raises :class:`BadValue` for a value Python cannot hold (a timestamp
    past year 9999, an unknown type, nesting deeper than ``MAX_DEPTH``) and
    :class:`BadTable` when the lengths disagree.
    """
    if len(table) < 4:
        raise BadTable("shorter than its length")
    (size,) = _U32.unpack_from(table, 0)
    if size != len(table) - 4:
        raise BadTable("its length disagrees with its bytes")
    return _table(table, 4, len(table), 0)


def _table(data: bytes, pos: int, end: int, depth: int) -> dict[Any, Any]:
    found: dict[Any, Any] = {}
    while pos < end:
        length = data[pos]
        key = table_key(data[pos + 1 : pos + 1 + length])
        pos += 1 + length
        if pos >= end:
            raise BadTable("an entry without a value")
        try:
            value, pos = _value(data, pos, end, depth)
        except BadValue as bad:  # the path is written on the way out: none is built before
            bad.path = (repr(key), *bad.path)
            raise
        found.pop(key, None)
        found[key] = value
    return found


def _value(data: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    kind = data[pos : pos + 1]
    pos += 1
    number = _NUMBERS.get(kind)
    if number is not None:
        _within(pos + number.size, end)
        return number.unpack_from(data, pos)[0], pos + number.size
    if kind == b"t":
        _within(pos + 1, end)
        return data[pos] != 0, pos + 1
    if kind == b"V":
        return None, pos
    if kind == b"D":
        _within(pos + 5, end)
        scale, raw = _DECIMAL.unpack_from(data, pos)
        digits = Decimal(raw).as_tuple()  # exact: no context rounds it
        return Decimal((digits.sign, digits.digits, -scale)), pos + 5
    if kind == b"T":
        _within(pos + 8, end)
        (seconds,) = _U64.unpack_from(data, pos)
        try:
            return _EPOCH + timedelta(seconds=seconds), pos + 8
        except OverflowError:
            (signed,) = _I64.unpack_from(data, pos)
            told = f"{seconds}" + (f" (signed: {signed})" if signed < 0 else "")
            raise BadValue(
                f"timestamp {told} seconds is out of the range Python dates can hold"
            ) from None
    if kind not in _SIZED:
        raise BadValue(f"field type {kind!r} value cannot be decoded (an unknown type)")
    _within(pos + 4, end)
    (size,) = _U32.unpack_from(data, pos)
    start, stop = pos + 4, pos + 4 + size
    _within(stop, end)
    if kind == b"S":
        text = data[start:stop]
        try:
            return text.decode("utf-8"), stop
        except UnicodeDecodeError:
            return text, stop
    if kind == b"x":
        return data[start:stop], stop
    if depth >= MAX_DEPTH:
        raise BadValue("nested too deeply to decode")
    if kind == b"F":
        return _table(data, start, stop, depth + 1), stop
    items: list[Any] = []
    while start < stop:
        try:
            item, start = _value(data, start, stop, depth + 1)
        except BadValue as bad:
            bad.path = (f"[{len(items)}]", *bad.path)
            raise
        items.append(item)
    return items, stop


def _within(pos: int, end: int) -> None:
    if pos > end:
        raise BadTable("a value past the table's end")


def join(pieces: list[bytes]) -> bytes:
    """A table of entries already encoded (key and typed value each)."""
    data = b"".join(pieces)
    return _U32.pack(len(data)) + data


__all__ = ["MAX_DEPTH", "BadTable", "BadValue", "decode", "entries", "join", "table_key"]
