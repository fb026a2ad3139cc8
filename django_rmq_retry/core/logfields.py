"""The fields every log record about a message carries, as ``extra`` (JSON formatters pick
them up): ``receiver``, ``message_id``, ``attempt``, ``queue``, ``trace_id``.

``trace_id`` is read from the message's W3C ``traceparent`` header (the sender's trace, the
one every attempt's span belongs to), so log lines and traces meet without OpenTelemetry
being imported here. :data:`current_message` is the message a receiver thread runs now:
``django_rmq_retry.observability.logs.MessageFields`` (a logging filter) gives the
receiver's own log records the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from .message import Message

FIELDS = ("receiver", "message_id", "attempt", "queue", "trace_id")

#: The message whose receiver runs on this thread (``None``: none).
current_message: ContextVar[Message | None] = ContextVar(
    "django_rmq_retry_current_message", default=None
)


def trace_id(headers: Mapping[str, Any] | None) -> str | None:
    """The 32-hex trace id of a ``traceparent`` header (``None``: none or malformed)."""
    value = headers.get("traceparent") if headers else None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    parts = value.split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    return parts[1]


def attempt_of(headers: Mapping[str, Any] | None, attempt_header: str) -> int:
    """Our attempt header as a number (absent or not an integer: 1)."""
    value = headers.get(attempt_header) if headers else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def fields(
    receiver: str, queue: str, properties: Mapping[str, Any], attempt: int
) -> dict[str, Any]:
    """The ``extra`` of a log record about the message with these AMQP ``properties``."""
    return {
        "receiver": receiver,
        "message_id": properties.get("message_id"),
        "attempt": attempt,
        "queue": queue,
        "trace_id": trace_id(properties.get("headers")),
    }


def message_fields(message: Message) -> dict[str, Any]:
    return {
        "receiver": message.receiver,
        "message_id": message.message_id,
        "attempt": message.attempt,
        "queue": message.queue,
        "trace_id": trace_id(message.headers),
    }
