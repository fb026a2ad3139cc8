"""What a delivery says about itself, and the properties of what we publish. Pure.

AMQP properties travel here as a plain ``dict`` keyed by the ``BasicProperties`` attribute
names, so this module never sees the AMQP client. Incoming, :func:`read_incoming` reads
everything our headers say about a delivery in one call. Outgoing, three kinds of message
share one base (:func:`_copy`): a fresh one (:func:`build_properties`), the copy published
for a retry (:func:`retry_properties`) and the copy published for a requeue
(:func:`requeue_properties`).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .failure import Failure
from .names import Names

#: Every AMQP basic property, by its ``BasicProperties`` attribute name.
PROPERTY_NAMES: tuple[str, ...] = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

#: The properties a caller may set on a fresh message (the rest are ours to set).
CALLER_PROPERTIES = frozenset(
    {
        "message_id",
        "correlation_id",
        "reply_to",
        "priority",
        "type",
        "app_id",
        "timestamp",
        "content_encoding",
        "expiration",
        "user_id",
        "cluster_id",
    }
)

#: Headers owned by the broker; never copied into a message we publish.
BROKER_HEADERS = frozenset({"x-death", "x-delivery-count", "x-acquired-count", "CC", "BCC"})
BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")

#: Stands in for a header table the AMQP client could not decode (see ``broker.headerguard``).
UNDECODABLE_HEADERS = "django-rmq-retry-undecodable-headers"

#: The attempt number we accept from a header; anything above is treated as this.
MAX_ATTEMPT = 1_000_000


@dataclass(frozen=True)
class Envelope:
    """What our headers say about one delivery (each value checked, never trusted blindly)."""

    attempt: int  # 1 on the first delivery
    exchange: str  # where the message was first published, even on a retry
    routing_key: str
    requeued: int  # times an operator requeued it
    first_failure: datetime | None
    parked_id: str | None  # the parked row a requeued copy came from
    target: str | None  # the receiver queue a retry or requeue copy is addressed to
    undecodable: str | None  # why the header table could not be read (it was dropped)
    warning: str | None  # a header we ignored, and why


def read_incoming(
    headers: Mapping[str, Any] | None, exchange: str, routing_key: str, names: Names
) -> Envelope:
    """Everything our headers say about a delivery that arrived on ``exchange``/``routing_key``."""
    headers = headers or {}
    attempt, warning = _attempt(headers, names)
    h = names.header
    original_exchange = _str(headers, h("original-exchange"))
    original_key = _str(headers, h("original-routing-key"))
    if original_exchange is not None and original_key is not None:
        # Copies travelling through the delay levels carry a binary routing key.
        exchange, routing_key = original_exchange, original_key
    undecodable = headers.get(UNDECODABLE_HEADERS) if UNDECODABLE_HEADERS in headers else None
    return Envelope(
        attempt=attempt,
        exchange=exchange,
        routing_key=routing_key,
        requeued=_int(headers, h("requeued")) or 0,
        first_failure=_when(_str(headers, h("first-failure"))),
        parked_id=_str(headers, h("parked-id")),
        target=_str(headers, names.target_header),
        undecodable=None if undecodable is None else str(undecodable),
        warning=warning,
    )


def _attempt(headers: Mapping[str, Any], names: Names) -> tuple[int, str | None]:
    """Attempt number (1-based) and a warning if the header was bad.

    Missing means 1. A header that is not a positive integer (a string, a list, a negative
    number...) restarts the count at 1 rather than crash or loop; the warning says why.
    """
    raw = headers.get(names.header("attempt"))
    if raw is None:
        return 1, None
    if isinstance(raw, bool) or not isinstance(raw, int):
        if isinstance(raw, str | bytes) and raw.strip().isdigit():
            raw = int(raw)
        else:
            return 1, f"ignored malformed {names.header('attempt')} header {_short(raw)}"
    if raw < 1:
        return 1, f"ignored non-positive {names.header('attempt')} header {raw}"
    return min(raw, MAX_ATTEMPT), None


def _int(headers: Mapping[str, Any], name: str) -> int | None:
    raw = headers.get(name)
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str | bytes) and raw.strip().isdigit():
        return int(raw)
    return None


def _str(headers: Mapping[str, Any], name: str) -> str | None:
    raw = headers.get(name)
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return raw if isinstance(raw, str) else None


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_broker_header(name: str) -> bool:
    return name in BROKER_HEADERS or name.startswith(BROKER_HEADER_PREFIXES)


def clean_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Caller headers minus the broker-owned ones (``x-death`` & co.)."""
    return {k: v for k, v in (headers or {}).items() if not is_broker_header(str(k))}


def iso(at: datetime) -> str:
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds")


# Outgoing ---------------------------------------------------------------------------------
def build_properties(
    content_type: str, headers: Mapping[str, Any] | None, properties: Mapping[str, Any]
) -> dict[str, Any]:
    """Properties of a fresh message: the caller's, plus persistence, an id and a timestamp."""
    unknown = set(properties) - CALLER_PROPERTIES
    if unknown:
        raise TypeError(f"unknown message properties: {', '.join(sorted(unknown))}")
    props: dict[str, Any] = dict(properties)
    props["content_type"] = content_type
    props["delivery_mode"] = 2
    props["headers"] = dict(headers or {})
    props.setdefault("message_id", uuid.uuid4().hex)
    props.setdefault("timestamp", int(time.time()))
    return props


def _copy(properties: Mapping[str, Any], names: Names, ours: Mapping[str, Any]) -> dict[str, Any]:
    """The properties of a copy we publish of a message we received.

    Body and every property are kept except two that would break the delay path:
    ``expiration`` (a per-message TTL would cut the wait short and, on the receiver queue,
    drop the message) and ``user_id`` (the broker refuses a user id that is not ours). Both
    are kept in headers. Broker-owned headers are dropped: our counting never reads them.
    ``ours`` is then written over the headers (a ``None`` value removes that header).
    """
    props = {k: properties.get(k) for k in PROPERTY_NAMES if k != "headers"}
    headers = clean_headers(properties.get("headers"))
    h = names.header
    if props.get("expiration") is not None:
        headers[h("original-expiration")] = props["expiration"]
    if props.get("user_id") is not None:
        headers[h("original-user-id")] = props["user_id"]
    props["expiration"] = props["user_id"] = None
    for key, value in ours.items():
        if value is None:
            headers.pop(key, None)
        else:
            headers[key] = value
    props["headers"] = headers
    props["delivery_mode"] = 2
    return props


def retry_properties(
    properties: Mapping[str, Any],
    *,
    names: Names,
    attempt: int,
    failure: Failure,
    exchange: str,
    routing_key: str,
    target_queue: str,
    due_ms: int,
) -> dict[str, Any]:
    """Properties of the copy published for the next attempt."""
    h = names.header
    first = _str(properties.get("headers") or {}, h("first-failure")) or iso(failure.at)
    return _copy(
        properties,
        names,
        {
            h("attempt"): attempt,
            h("first-failure"): first,
            h("last-failure"): iso(failure.at),
            h("error-type"): failure.error_type,
            h("error"): failure.error_message,
            h("original-exchange"): exchange,
            h("original-routing-key"): routing_key,
            h("due"): due_ms,
            names.target_header: target_queue,
        },
    )


def requeue_properties(
    properties: Mapping[str, Any],
    *,
    names: Names,
    exchange: str,
    routing_key: str,
    target_queue: str | None,
    parked_id: int | str,
    requeue_count: int,
) -> dict[str, Any]:
    """Properties of a parked message sent back to work: attempts reset, history kept."""
    h = names.header
    reset = dict.fromkeys(
        [
            h(key)
            for key in ("attempt", "due", "first-failure", "last-failure", "error-type", "error")
        ]
    )
    return _copy(
        properties,
        names,
        {
            **reset,
            h("original-exchange"): exchange,
            h("original-routing-key"): routing_key,
            h("requeued"): requeue_count,
            h("parked-id"): str(parked_id),
            names.target_header: target_queue,
        },
    )


def delivery_digest(queue: str, message_id: Any, body: bytes, *extra: str) -> str:
    """A stable identity for one message in one queue: sha256 of queue, id, body and ``extra``.

    The same delivery redelivered gets the same digest, so it finds what an earlier delivery
    stored (the park key, the delivery-limit row). Changing how it is built re-keys rows
    already stored: a redelivery would then park twice.
    """
    parts = [queue, str(message_id or ""), hashlib.sha256(body).hexdigest(), *extra]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
