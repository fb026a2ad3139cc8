"""What to do with a delivery whose receiver raised. Pure: standard library only."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from .backoff import Policy, matches
from .errors import Reject, Retry


class ParkReason(str, Enum):
    EXHAUSTED = "exhausted"
    REJECTED = "rejected"
    NON_RETRYABLE = "non_retryable"
    UNDECODABLE = "undecodable"
    DELIVERY_LIMIT = "delivery_limit"
    ORPHANED = "orphaned"


@dataclass(frozen=True)
class RetryLater:
    """Publish a copy for attempt ``next_attempt`` that waits ``delay`` seconds."""

    delay: float
    next_attempt: int


@dataclass(frozen=True)
class Park:
    """Write the message to the parked table, then ack."""

    reason: ParkReason
    detail: str


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
