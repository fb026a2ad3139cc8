"""Message properties encoded once, as the broker receives them, and published as they are.

A message written to the outbox is published later by a relay, often by another process.
Were only the properties stored as JSON, the relay would decode that JSON, rebuild pika's
properties object and encode it again for every row: a measurable share of the relay's CPU
(see bench/README.md), which on a small host is CPU the broker then lacks. The sender has
the properties at hand, so it encodes them to their AMQP form once
(:func:`encode_properties`) and the relay hands those bytes to the connection
(:class:`Encoded`) without looking inside.
"""

from __future__ import annotations

import calendar
import datetime
import decimal
import struct
from collections.abc import Mapping
from typing import Any

import pika
import pika.data

from ..core import amqptable
from ..core.envelope import PROPERTY_NAMES, RawHeaders
from .connection import from_pika, to_pika


class Encoded(pika.BasicProperties):
    """AMQP-encoded message properties: a ``pika.BasicProperties`` whose ``encode()`` gives
    the stored bytes, so they go to the wire unchanged through pika's public ``basic_publish``.

    pika's content-header frame reads only ``INDEX`` (the class id) and ``encode()`` (the flag
    words and values, as pieces it then extends) of the properties it publishes; this class
    answers both without building anything. The values themselves are read from the bytes on
    first use only (``headers``, ``user_id``...: the same values a consumer would read) and
    cannot be assigned: bytes that are sent as they are do not change with an attribute.
    """

    def __init__(self, data: bytes, message_id: Any) -> None:
        # pika's __init__ would set every property to None: these values live in ``data``.
        fields = self.__dict__
        fields["data"] = data
        #: Kept beside the bytes: the confirm channel matches returned messages by it.
        fields["message_id"] = message_id

    def encode(self) -> list[bytes]:
        return [self.data]  # a new list each time: pika inserts the frame's header into it

    def decode(  # type: ignore[override]  # ours: read the bytes, never write into them
        self, encoded: bytes | None = None, offset: int = 0
    ) -> dict[str, Any]:
        """The properties as a consumer would read them (for whoever asks: a test broker).

        pika's ``decode(encoded, offset)`` fills a properties object from a frame; pika
        calls it on objects it builds itself, never on one it publishes, and these bytes
        are fixed: asked to, this raises ``TypeError``."""
        if encoded is not None:
            raise TypeError("Encoded properties are fixed bytes: decode into a BasicProperties")
        return dict(self._values())

    def _values(self) -> dict[str, Any]:
        values: dict[str, Any] | None = self.__dict__.get("_decoded")
        if values is None:  # decoded once, when first asked for
            values = self.__dict__["_decoded"] = decode_properties(self.data)
        return values

    def __getattr__(self, name: str) -> Any:
        # Only names not set on the instance get here: a property other than message_id.
        if name in _PROPERTY_NAMES:
            return self._values().get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Encoded properties are fixed bytes: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Encoded):
            return self.data == other.data and self.message_id == other.message_id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"<Encoded({len(self.data)} bytes, message_id={self.message_id!r})>"


_PROPERTY_NAMES = frozenset(PROPERTY_NAMES)


def encode_properties(properties: Mapping[str, Any]) -> bytes:
    """``properties`` (our names, pika's values) as the content header carries them.

    The same bytes pika writes (``tests/test_wire.py`` compares them on generated input), at
    a fraction of the CPU (see bench/README.md): pika builds a properties object per message
    and encodes its header table value by value through a chain of ``isinstance`` checks, a
    large cost of publishing a requeued message (a table of six headers). Values of any
    other type than the usual ones (subclasses, integers past 64 bits) and every error take
    pika's own path, so what pika accepts, refuses and raises stays the same. One addition:
    a float in a header table is written as an AMQP double, which pika 1.4 refuses, so that
    headers read from a foreign client (floats included) can be sent on.

    Raises what pika raises for a value AMQP cannot carry: at the sender's call, where the
    mistake is, not later in a relay."""
    try:
        return _encode(properties)
    except Exception:  # an unusual value, or an error: pika's own path says which
        return b"".join(to_pika(properties).encode())


class _Unusual(Exception):
    """A value the fast path leaves to pika."""


_BYTE = [bytes((i,)) for i in range(256)]
_U32 = struct.Struct(">I").pack
_INT = struct.Struct(">ci").pack
_LONG = struct.Struct(">cq").pack
_TIMESTAMP = struct.Struct(">Q").pack
_DOUBLE = struct.Struct(">cd").pack
_DECIMAL = struct.Struct(">cBi").pack
_FLAGS = struct.Struct(">H").pack
_INT32 = range(-(2**31), 2**31)
_INT64 = range(-(2**63), 2**63)

#: (property, its flag bit, how it is encoded), in the order AMQP 0-9-1 lays them out.
_LAYOUT = (
    ("content_type", 1 << 15, "s"),
    ("content_encoding", 1 << 14, "s"),
    ("headers", 1 << 13, "table"),
    ("delivery_mode", 1 << 12, "octet"),
    ("priority", 1 << 11, "octet"),
    ("correlation_id", 1 << 10, "s"),
    ("reply_to", 1 << 9, "s"),
    ("expiration", 1 << 8, "s"),
    ("message_id", 1 << 7, "s"),
    ("timestamp", 1 << 6, "timestamp"),
    ("type", 1 << 5, "s"),
    ("user_id", 1 << 4, "s"),
    ("app_id", 1 << 3, "s"),
    ("cluster_id", 1 << 2, "s"),
)


def _encode(properties: Mapping[str, Any]) -> bytes:
    flags = 0
    pieces: list[bytes] = []
    for name, flag, kind in _LAYOUT:
        value = properties.get(name)
        if value is None:
            continue
        flags |= flag
        if kind == "s":
            pieces.append(_short(value))
        elif kind == "table":
            if type(value) is RawHeaders:
                pieces.append(_spliced(value))
            elif type(value) is not dict:
                raise _Unusual
            else:
                pieces.append(_table(value))
        elif kind == "octet":
            if type(value) is not int or not 0 <= value <= 255:
                raise _Unusual
            pieces.append(_BYTE[value])
        else:
            if type(value) is not int or not 0 <= value < 2**64:
                raise _Unusual
            pieces.append(_TIMESTAMP(value))
    return _FLAGS(flags) + b"".join(pieces)


def _short(value: Any) -> bytes:
    if type(value) is str:
        data = value.encode()
    elif type(value) is bytes:
        data = value
    else:
        raise _Unusual
    if len(data) > 255:
        raise _Unusual
    return _BYTE[len(data)] + data


def _table(table: dict[Any, Any]) -> bytes:
    pieces = []
    for key, value in table.items():
        pieces.append(_short(key))
        pieces.append(_value(value))
    data = b"".join(pieces)
    return _U32(len(data)) + data


def _spliced(headers: RawHeaders) -> bytes:
    """A copy's headers: the entries it kept from a received table as the bytes they came
    as (their types exactly as the sender wrote them), the others encoded here."""
    kept = headers.entries
    pieces = []
    for key, value in headers.items():
        entry = kept.get(key)
        if entry is not None:
            pieces.append(entry)
            continue
        pieces.append(_short(key))
        try:
            pieces.append(_value(value))
        except _Unusual:  # a subclass, a huge integer...: as pika writes it
            encoded: list[bytes] = []
            pika.data.encode_value(encoded, value)
            pieces.append(b"".join(encoded))
    return amqptable.join(pieces)


def _value(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        data = value.encode()
        return b"S" + _U32(len(data)) + data
    if kind is int:
        if value in _INT32:
            return _INT(b"I", value)
        if value in _INT64:
            return _LONG(b"l", value)
        raise _Unusual
    if kind is bool:
        return b"t\x01" if value else b"t\x00"
    if value is None:
        return b"V"
    if kind is dict:
        return b"F" + _table(value)
    if kind is list:
        data = b"".join([_value(item) for item in value])
        return b"A" + _U32(len(data)) + data
    if kind is bytes:
        return b"x" + _U32(len(value)) + value
    if kind is float:
        # AMQP's double. pika 1.4 refuses floats, but a receiver reads a foreign double as
        # a float (core.amqptable) and may pass the headers on: they go out as they came.
        return _DOUBLE(b"d", value)
    if kind is decimal.Decimal:
        # As pika writes it (scale octet, then an int32 of the digits); a value that does
        # not fit raises, and pika's path then raises what pika raises.
        value = value.normalize()
        exponent = value.as_tuple().exponent
        if not isinstance(exponent, int):  # NaN, Infinity
            raise _Unusual
        if exponent < 0:
            return _DECIMAL(b"D", -exponent, int(value * (decimal.Decimal(10) ** -exponent)))
        return _DECIMAL(b"D", 0, int(value))
    if kind is datetime.datetime:
        return b"T" + _TIMESTAMP(calendar.timegm(value.utctimetuple()))
    raise _Unusual


def decode_properties(data: bytes) -> dict[str, Any]:
    properties = pika.BasicProperties()
    properties.decode(data)
    return from_pika(properties)


__all__ = ["Encoded", "decode_properties", "encode_properties"]
