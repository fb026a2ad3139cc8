"""Message properties encoded once, as the broker receives them, and published as they are.

A message written to the outbox is published later by a relay, often by another process.
Storing only the properties as JSON made the relay decode that JSON, rebuild pika's
properties object and encode it again for every row: about 40 % of the relay's CPU, which
on a small host is CPU the broker then lacks. The sender has the properties at hand, so it
encodes them to their AMQP form once (:func:`encode_properties`) and the relay hands those
bytes to the connection (:class:`Encoded`) without looking inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pika

from .connection import from_pika, to_pika


class Encoded:
    """AMQP-encoded message properties, where pika expects its properties object.

    pika's content-header frame asks its properties for ``INDEX`` (the class id) and for
    ``encode()`` (the flag words and values, as pieces it then extends): nothing else is read
    on the way out, so the stored bytes go to the wire unchanged.
    """

    __slots__ = ("data", "message_id")
    INDEX = pika.BasicProperties.INDEX

    def __init__(self, data: bytes, message_id: Any) -> None:
        self.data = data
        #: Kept beside the bytes: the confirm channel matches returned messages by it.
        self.message_id = message_id

    def encode(self) -> list[bytes]:
        return [self.data]  # a new list each time: pika inserts the frame's header into it

    def decode(self) -> dict[str, Any]:
        """The properties as a consumer would read them (for whoever asks: a test broker)."""
        return decode_properties(self.data)


def encode_properties(properties: Mapping[str, Any]) -> bytes:
    """``properties`` (our names, pika's values) as the content header carries them.

    Raises what pika raises for a value AMQP cannot carry: at the sender's call, where the
    mistake is, not later in a relay."""
    return b"".join(to_pika(properties).encode())


def decode_properties(data: bytes) -> dict[str, Any]:
    properties = pika.BasicProperties()
    properties.decode(data)
    return from_pika(properties)


__all__ = ["Encoded", "decode_properties", "encode_properties"]
