"""The object a receiver is handed."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Message:
    """One delivery, decoded.

    ``body`` is the decoded payload (JSON value, ``str`` for text, ``bytes`` otherwise) and
    ``raw`` the exact bytes. ``routing_key``/``exchange`` are the ones the message was first
    published with, even on a retry that travelled through the delay levels. ``attempt`` is
    1 on the first delivery and counts our retries, not broker redeliveries (see
    ``redelivered``). ``data`` is what the receiver's schema made of the body (an instance
    of it, validated before the receiver ran), or the body itself without a schema.
    """

    body: Any
    raw: bytes
    headers: dict[str, Any]
    routing_key: str
    exchange: str
    queue: str
    receiver: str
    message_id: str | None
    correlation_id: str | None
    content_type: str | None
    timestamp: datetime | None
    attempt: int
    redelivered: bool
    requeued: int = 0
    properties: dict[str, Any] = field(default_factory=dict, repr=False)
    data: Any = None
