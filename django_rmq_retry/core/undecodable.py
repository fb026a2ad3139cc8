"""Which part of a delivery cannot be read, and what of it a parked row keeps. Pure.

AMQP says the short-string properties (content type, message id, ...), header names and
routing keys are UTF-8 text; a client that is not ours can put any bytes there. The AMQP
client then hands the value over as ``bytes``, and a header table it cannot decode at all
arrives replaced by the header guard's marker (``broker.headerguard``). None of these may
reach a receiver, nor make the consumer give the message back: the message is parked at
once with a reason naming the value, and its bytes are kept in the row (bytes are stored
as marked base64 by the row codec).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .envelope import UndecodableHeaders

#: The basic properties AMQP defines as short strings (UTF-8 text).
TEXT_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

#: Extra keys of a delivery's properties (never published; a parked row keeps them in its
#: properties): the bytes of a header table the AMQP client could not decode, and of an
#: exchange name or routing key that is not UTF-8.
RAW_HEADERS = "undecodable_headers"
RAW_EXCHANGE = "undecodable_exchange"
RAW_ROUTING_KEY = "undecodable_routing_key"


def unreadable(properties: Mapping[str, Any]) -> str | None:
    """Why this delivery's properties, header names or routing cannot be read, or None."""
    for name, label in ((RAW_EXCHANGE, "exchange name"), (RAW_ROUTING_KEY, "routing key")):
        if properties.get(name) is not None:
            return f"{label} is not UTF-8 text: {_preview(properties[name])}"
    for name in TEXT_PROPERTIES:
        value = properties.get(name)
        if value is not None and not isinstance(value, str):
            return f"property {name} is not UTF-8 text: {_preview(value)}"
    key = _binary_key(properties.get("headers"))
    if key is not None:
        return f"header key {_preview(key)} is not UTF-8 text"
    return None


def without_headers(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The properties a parked row keeps when the header table could not be decoded.

    The table is dropped (so a requeue of the row is an ordinary message, not the
    undecodable marker again); its bytes stay in the row under :data:`RAW_HEADERS`.
    """
    headers = properties.get("headers") or {}
    kept = {**properties, "headers": {}}
    raw = headers.get(RAW_HEADERS) if isinstance(headers, UndecodableHeaders) else None
    if isinstance(raw, bytes):
        kept[RAW_HEADERS] = raw
    return kept


def _binary_key(headers: Any) -> bytes | None:
    """The first table key, at any depth, that the AMQP client left as bytes."""
    stack = [headers]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            for key, inner in value.items():
                if isinstance(key, bytes):
                    return key
                if isinstance(inner, Mapping | list):
                    stack.append(inner)
        elif isinstance(value, list):
            stack.extend(v for v in value if isinstance(v, Mapping | list))
    return None


def _preview(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
