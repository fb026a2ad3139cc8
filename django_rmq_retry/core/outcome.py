"""What to do with a delivery: before its receiver runs (:func:`triage`) and after it raised
(:func:`decide`). Pure: standard library only."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .backoff import Policy, matches
from .bodies import Undecodable, decode_body
from .envelope import Envelope
from .errors import Reject, Retry
from .undecodable import unreadable


class ParkReason(str, Enum):
    EXHAUSTED = "exhausted"
    REJECTED = "rejected"
    NON_RETRYABLE = "non_retryable"
    UNDECODABLE = "undecodable"
    DELIVERY_LIMIT = "delivery_limit"
    ORPHANED = "orphaned"
    INVALID = "invalid"  # the body does not fit its schema (``consumer.schema_gate``)


@dataclass(frozen=True)
class RetryLater:
    """Publish a copy for attempt ``next_attempt`` that waits ``delay`` seconds."""

    delay: float
    next_attempt: int


@dataclass(frozen=True)
class Park:
    """Write the message to the parked table, then ack.

    ``field_errors``: an invalid body's failing fields (``[{"loc": [...], "msg": ...}]``).
    """

    reason: ParkReason
    detail: str
    field_errors: list[dict[str, Any]] | None = None


Decision = RetryLater | Park


def decide(
    attempt: int,
    exc: BaseException,
    policy: Policy,
    *,
    max_delay: float | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """Retry or park after ``exc`` ended attempt ``attempt`` (1-based).

    ``max_delay`` is the longest wait the broker topology can hold; longer requests are
    clamped to it rather than refused.
    """
    if isinstance(exc, Reject):
        return Park(ParkReason.REJECTED, exc.reason)
    if not isinstance(exc, Retry) and matches(exc, policy.dont_retry):
        return Park(ParkReason.NON_RETRYABLE, f"{type(exc).__name__} is never retried")
    if attempt >= policy.max_attempts:
        return Park(
            ParkReason.EXHAUSTED,
            f"failed {attempt} time{'s' if attempt != 1 else ''} (max attempts {policy.max_attempts})",
        )
    if isinstance(exc, Retry) and exc.delay is not None:
        delay = exc.delay
    else:
        delay = policy.delay(attempt, rng)
    if max_delay is not None:
        delay = min(delay, max_delay)
    return RetryLater(delay=max(0.0, delay), next_attempt=attempt + 1)


@dataclass(frozen=True)
class Run:
    """Hand the decoded body to the receiver (and ``data``, e.g. the typed instance the
    body was validated into, as ``message.data``; ``None``: the body)."""

    body: Any
    data: Any = None


def triage(
    envelope: Envelope,
    body: bytes,
    properties: Mapping[str, Any],
    *,
    orphaned: bool = False,
    over_limit: Park | None = None,
) -> Run | Park:
    """Run the receiver, or park the delivery before it runs, and why.

    In order: a retry whose receiver queue vanished (it arrived on the orphans queue), a
    message that kept killing the consumer (``over_limit``, from the delivery-limit count),
    a header table the AMQP client could not decode, a body that does not decode as its
    content type says.
    """
    if orphaned:
        return Park(
            ParkReason.ORPHANED,
            f"receiver queue {envelope.target or '?'!r} did not exist when the message was due",
        )
    if over_limit is not None:
        return over_limit
    if envelope.undecodable is not None:
        return Park(
            ParkReason.UNDECODABLE,
            f"{envelope.undecodable}; the row keeps the header table as raw bytes only",
        )
    problem = unreadable(properties)
    if problem is not None:
        return Park(ParkReason.UNDECODABLE, problem)
    try:
        decoded = decode_body(
            body, properties.get("content_type"), properties.get("content_encoding")
        )
    except Undecodable as exc:
        return Park(ParkReason.UNDECODABLE, str(exc))
    return Run(decoded)
