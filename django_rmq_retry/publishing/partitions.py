"""The publisher's half of per-key order: each message's partition, in a header.

An ordered receiver (``@receiver(topic, ordering_key=...)``) reads N partition queues
(``core.topology_plan``); its partition exchange sends a message to partition ``k`` when the
header ``<prefix>-partition:<its queue>`` says ``"k"``. The publisher computes ``k`` from the
message's key (``core.ordering.partition_of``), for every ordered receiver of the topic this
process knows: two receivers may order one topic by different keys.

The key is read from the body decoded from the bytes about to be sent, exactly as the
consumer will decode it, so a date, a UUID or a Decimal gives the same key on both sides.
A message whose key cannot be read raises ``OrderingKeyError`` (a ``ValueError``) at
``send``, before anything is published or written to the outbox: the sender is the one who
can fix it, and a message with no partition would reach no partition queue.

Every process that sends to a topic with an ordered receiver must know that receiver (its
app installed, as Django projects deploy); one that does not sends no partition header, and
the ordered receiver does not get the message (the consumer's documentation says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..conf import ordering_partitions
from ..core.bodies import decode_body
from ..core.message import Message
from ..core.names import Names
from ..core.ordering import OrderingKeyError, partition_of
from ..registry import default_registry

#: Sets the partition headers of one message: ``(body bytes, properties) -> None``.
Partitioner = Callable[[bytes, dict[str, Any]], None]


def partitioner(routing_key: str, exchange: str, names: Names) -> Partitioner | None:
    """What sets the partition headers of messages sent to ``routing_key`` on ``exchange``;
    ``None`` (the usual case) when no ordered receiver of this process reads that topic."""
    if exchange != names.work_exchange:
        return None
    ordered = [
        r
        for r in default_registry.all()
        if r.ordering_key is not None and routing_key in r.routing_keys
    ]
    if not ordered:
        return None
    partitions = ordering_partitions()
    targets = [(r, names.partition_header(r.queue_name(names.prefix))) for r in ordered]

    def set_partitions(data: bytes, props: dict[str, Any]) -> None:
        message = _message(routing_key, names.work_exchange, data, props)
        headers = props["headers"]
        for rec, header in targets:
            headers[header] = str(partition_of(rec.key_of(message), partitions))

    return set_partitions


def _message(routing_key: str, exchange: str, data: bytes, props: dict[str, Any]) -> Message:
    """The message as the ordered receiver's consumer will see it (before any attempt)."""
    try:
        body = decode_body(data, props.get("content_type"), props.get("content_encoding"))
    except ValueError as exc:
        raise OrderingKeyError(f"the body cannot be decoded to read its key: {exc}") from exc
    return Message(
        body=body,
        raw=data,
        headers=dict(props.get("headers") or {}),
        routing_key=routing_key,
        exchange=exchange,
        queue="",
        receiver="",
        message_id=props.get("message_id"),
        correlation_id=props.get("correlation_id"),
        content_type=props.get("content_type"),
        timestamp=None,
        attempt=1,
        redelivered=False,
        properties=props,
    )


__all__ = ["Partitioner", "partitioner"]
