"""A publish's frames marshalled in one piece, the bytes pika would write.

pika writes a ``basic.publish`` as three frame objects (method, content header, body), each
built from objects of its own (the method, the header, the properties) and marshalled
through a chain of calls: a measurable share of a requeue's CPU and of ``send_many``'s
(see bench/README.md). The layout is fixed by AMQP 0-9-1 and few values vary, so
:func:`publish_frames` writes the same bytes directly (``tests/test_frames.py`` compares
them with pika's on generated input). A name AMQP
cannot carry takes pika's own path, and so does a pika whose channel cannot be written to
this way (``pikaext.FrameWriter``, which writes these bytes: this module is pure).
"""

from __future__ import annotations

import struct

#: Frame header: type, channel, payload size.
_FRAME = struct.Struct(">BHI").pack
_END = b"\xce"
#: basic.publish: class 60, method 40, the reserved ticket (0).
_PUBLISH = struct.Struct(">HHH").pack(60, 40, 0)
#: Content header: class 60, weight 0 (reserved), body size.
_CONTENT = struct.Struct(">HHQ").pack
_BYTE = [bytes((i,)) for i in range(256)]


def publish_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    properties: bytes,
    body: bytes,
    body_max: int,
) -> bytes | None:
    """The frames of one publish, ``properties`` already encoded (``wire``); ``None`` when
    a name is not text or longer than AMQP's 255 bytes (pika's path raises what it raises).

    ``body_max`` is the connection's largest body frame payload (frame max minus 8)."""
    if type(exchange) is not str or type(routing_key) is not str or type(body) is not bytes:
        return None
    ex = exchange.encode()
    key = routing_key.encode()
    if len(ex) > 255 or len(key) > 255:
        return None
    method = b"".join(
        (_PUBLISH, _BYTE[len(ex)], ex, _BYTE[len(key)], key, b"\x01" if mandatory else b"\x00")
    )
    header = _CONTENT(60, 0, len(body)) + properties
    parts = [_FRAME(1, channel, len(method)), method, _END]
    parts += [_FRAME(2, channel, len(header)), header, _END]
    if len(body) <= body_max:
        if body:
            parts += [_FRAME(3, channel, len(body)), body, _END]
    else:
        for start in range(0, len(body), body_max):
            piece = body[start : start + body_max]
            parts += [_FRAME(3, channel, len(piece)), piece, _END]
    return b"".join(parts)


__all__ = ["publish_frames"]
