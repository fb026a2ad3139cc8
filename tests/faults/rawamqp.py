"""A tiny AMQP 0-9-1 publisher written from the spec with sockets and ``struct``.

The bad-input scenario must not share our encoder (pika's): this client lets a test put
exactly the bytes it wants on the wire — typed header values pika would never produce,
headers nested thousands of levels deep, any property combination — and see what the
broker and our consumer make of them. Publishing only, with publisher confirms.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlsplit

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = b"\xce"


class BrokerClosed(Exception):
    """The broker closed the channel or connection (reply code and text in args)."""


@dataclass(frozen=True)
class Void:
    """The ``V`` field type (no value)."""


@dataclass(frozen=True)
class Raw:
    """A pre-encoded field value: type letter plus bytes, for values no library would send."""

    kind: bytes
    data: bytes


def shortstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("B", len(raw)) + raw


def longstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack(">I", len(raw)) + raw


def field_value(value: Any) -> bytes:
    if isinstance(value, Raw):
        return value.kind + value.data
    if isinstance(value, Void) or value is None:
        return b"V"
    if isinstance(value, bool):
        return b"t" + struct.pack("B", value)
    if isinstance(value, int):
        return b"l" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, Decimal):
        sign, digits, exp = value.as_tuple()
        scale = -int(exp)
        number = int("".join(map(str, digits))) * (-1 if sign else 1)
        return b"D" + struct.pack(">Bi", scale, number)
    if isinstance(value, str | bytes):
        return b"S" + longstr(value)
    if isinstance(value, list | tuple):
        items = b"".join(field_value(v) for v in value)
        return b"A" + struct.pack(">I", len(items)) + items
    if isinstance(value, Mapping):
        return b"F" + table(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def table(values: Mapping[str, Any]) -> bytes:
    items = b"".join(shortstr(k) + field_value(v) for k, v in values.items())
    return struct.pack(">I", len(items)) + items


def nested(depth: int, leaf: Any = 1) -> Raw:
    """``{"n": {"n": ... leaf}}`` ``depth`` tables deep, encoded without recursion."""
    value = field_value(leaf)
    for _ in range(depth):
        inner = shortstr("n") + value
        value = b"F" + struct.pack(">I", len(inner)) + inner
    return Raw(value[:1], value[1:])


#: Basic properties in wire order with their flag bit and encoder.
PROPERTIES = (
    ("content_type", 15, shortstr),
    ("content_encoding", 14, shortstr),
    ("headers", 13, table),
    ("delivery_mode", 12, lambda v: struct.pack("B", v)),
    ("priority", 11, lambda v: struct.pack("B", v)),
    ("correlation_id", 10, shortstr),
    ("reply_to", 9, shortstr),
    ("expiration", 8, shortstr),
    ("message_id", 7, shortstr),
    ("timestamp", 6, lambda v: struct.pack(">Q", v)),
    ("type", 5, shortstr),
    ("user_id", 4, shortstr),
    ("app_id", 3, shortstr),
    ("cluster_id", 2, shortstr),
)


class RawPublisher:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port or 5672), timeout)
        self.buf = b""
        self.frame_max = 131072
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self._expect(0, 10, 10)  # Connection.Start
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        self._method(
            0,
            10,
            11,
            table({"product": "faults-rawamqp"})
            + shortstr("PLAIN")
            + longstr(b"\x00" + user.encode() + b"\x00" + password.encode())
            + shortstr("en_US"),
        )
        args = self._expect(0, 10, 30)  # Tune
        channel_max, frame_max, _heartbeat = struct.unpack(">HIH", args[:8])
        self.frame_max = frame_max or self.frame_max
        self._method(0, 10, 31, struct.pack(">HIH", channel_max, self.frame_max, 0))
        vhost = unquote(parts.path[1:]) if parts.path and parts.path != "/" else "/"
        self._method(0, 10, 40, shortstr(vhost) + shortstr("") + b"\x00")
        self._expect(0, 10, 41)
        self._method(1, 20, 10, shortstr(""))
        self._expect(1, 20, 11)
        self._method(1, 85, 10, b"\x00")  # Confirm.Select
        self._expect(1, 85, 11)

    # Frames ------------------------------------------------------------------------------
    def _frame(self, kind: int, channel: int, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">BHI", kind, channel, len(payload)) + payload + FRAME_END)

    def _method(self, channel: int, klass: int, method: int, args: bytes) -> None:
        self._frame(FRAME_METHOD, channel, struct.pack(">HH", klass, method) + args)

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise BrokerClosed("socket closed by the broker")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _next_method(self) -> tuple[int, int, int, bytes]:
        while True:
            kind, channel, size = struct.unpack(">BHI", self._read(7))
            payload = self._read(size)
            self._read(1)
            if kind != FRAME_METHOD:
                continue
            klass, method = struct.unpack(">HH", payload[:4])
            args = payload[4:]
            if (klass, method) in ((10, 50), (20, 40)):  # Connection.Close / Channel.Close
                code = struct.unpack(">H", args[:2])[0]
                text = args[3 : 3 + args[2]].decode(errors="replace")
                raise BrokerClosed(code, text)
            return channel, klass, method, args

    def _expect(self, channel: int, klass: int, method: int) -> bytes:
        got_channel, got_class, got_method, args = self._next_method()
        if (got_channel, got_class, got_method) != (channel, klass, method):
            raise BrokerClosed(f"unexpected method {got_class}.{got_method} on {got_channel}")
        return args

    # Publishing ---------------------------------------------------------------------------
    def publish(self, exchange: str, routing_key: str, body: bytes, **properties: Any) -> str:
        """Publish and wait for the confirm; returns ``"ack"``, ``"nack"`` or ``"returned"``."""
        self._method(
            1, 60, 40, struct.pack(">H", 0) + shortstr(exchange) + shortstr(routing_key) + b"\x01"
        )
        flags = 0
        plist = b""
        for name, bit, enc in PROPERTIES:
            if name in properties and properties[name] is not None:
                flags |= 1 << bit
                plist += enc(properties[name])
        header = struct.pack(">HHQH", 60, 0, len(body), flags) + plist
        self._frame(FRAME_HEADER, 1, header)
        step = self.frame_max - 8
        for start in range(0, len(body), step):
            self._frame(FRAME_BODY, 1, body[start : start + step])
        returned = False
        while True:
            _channel, klass, method, _args = self._next_method()
            if (klass, method) == (60, 50):
                returned = True
            elif (klass, method) == (60, 80):
                return "returned" if returned else "ack"
            elif (klass, method) == (60, 120):
                return "nack"

    def close(self) -> None:
        try:
            self._method(0, 10, 50, struct.pack(">H", 200) + shortstr("bye") + b"\x00" * 4)
            self._expect(0, 10, 51)
        except (OSError, BrokerClosed):
            pass
        finally:
            self.sock.close()
