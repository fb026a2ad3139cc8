"""The quorum-native delay engine on the worker side: a failed attempt becomes a give-back.

With ``DELAY_ENGINE = "quorum-native"`` a receiver's quorum queue holds its retries
(``core.native_retry``): instead of publishing a copy into the delay levels, the handler
asks the loop to ``basic.reject`` the delivery (:class:`~.actions.RetryInPlace`); the queue
counts it and hands it out again after the policy's delay. Nothing of the message changes
(no header rewrite): the attempt number is our header's plus the queue's
``x-delivery-count``. Parking after the last attempt is the cascade's (the row is committed
before the ack).

The queue's count also bounds every other give-back it counts (a crash, a lost connection).
A delivery it counted is therefore not counted again by the delivery limit's database rows
(a write per retry, on the path of every retry); instead it is parked unrun once its attempt
is past the policy's last (:func:`past_last_attempt`).

A delay the queue cannot give is never swapped silently for the one it gives: a
``Retry(delay=...)`` that asks for another delay parks the message, naming why, and a
RetryPolicy row whose delays differ from the code's (the queue was declared from the code's)
is named in a WARNING once per receiver.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..conf import code_policy
from ..core.backoff import Policy
from ..core.envelope import Envelope
from ..core.errors import Retry
from ..core.failure import error_summary, error_type_name
from ..core.logfields import message_fields
from ..core.message import Message
from ..core.native_retry import delivery_count, honours, native_retry, problems
from ..core.outcome import Park, ParkReason, RetryLater, decide
from ..registry import Receiver
from .actions import Delivery, RetryInPlace, StorePark, retried_kwargs

if TYPE_CHECKING:
    from .parks import Parks

logger = logging.getLogger("django_rmq_retry.consumer")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def retry_in_place(
    parks: Parks,
    policy: Policy,
    rng: random.Random,
    error_header_max: int,
    d: Delivery,
    rec: Receiver,
    env: Envelope,
    message: Message,
    exc: BaseException,
    start_key: str | None,
    took_ms: float,
) -> RetryInPlace | StorePark:
    """What follows a failed attempt under the quorum-native engine: park (the last
    attempt, a ``Reject``, a delay it cannot give) or give the delivery back to be held."""
    decision = decide(env.attempt, exc, policy, rng=rng)
    if isinstance(decision, Park):
        return parks.park(d, rec.name, env, decision, exc=exc, start_key=start_key, took_ms=took_ms)
    assert isinstance(decision, RetryLater)
    native = native_retry(code_policy(rec))
    failures = delivery_count(d.properties.get("headers") or {}) + 1
    delay_ms = native.delay_ms(failures)
    if (
        isinstance(exc, Retry)
        and exc.delay is not None
        and not honours(native, failures, exc.delay)
    ):
        why = (
            f"Retry(delay={exc.delay:g}) cannot be given by the quorum-native delay engine: "
            f"this receiver's queue waits {delay_ms / 1000:g}s before attempt "
            f"{decision.next_attempt} (raise Retry() without a delay, or use the cascade)"
        )
        park = Park(ParkReason.NON_RETRYABLE, why)
        return parks.park(d, rec.name, env, park, exc=exc, start_key=start_key, took_ms=took_ms)
    _warn_if_row_differs(rec, policy)
    log_line = (
        f"retry {rec.name} message {message.message_id} attempt "
        f"{decision.next_attempt}/{policy.max_attempts} in {delay_ms / 1000:.1f}s (held by "
        f"its quorum queue) after {error_type_name(exc)}: {error_summary(exc, error_header_max)}"
    )
    return RetryInPlace(
        cause="a retry held by its quorum queue",
        start_key=start_key,
        log_line=log_line,
        log_extra=message_fields(message),
        signal_kwargs=retried_kwargs(rec.name, message, env.attempt, delay_ms / 1000, exc),
    )


def counted_by_queue(headers: Mapping[str, Any]) -> bool:
    """Whether the quorum queue counted give-backs of this delivery's message."""
    return delivery_count(headers) > 0


def past_last_attempt(env: Envelope, policy: Policy, headers: Mapping[str, Any]) -> Park | None:
    """Park before running a delivery whose attempt (the queue's count included) is past the
    policy's last: only give-backs we did not decide lead there (our last attempt parks), so
    the receiver or its process died on the way, again and again."""
    if env.attempt <= policy.max_attempts:
        return None
    return Park(
        ParkReason.DELIVERY_LIMIT,
        f"given back {delivery_count(headers)} times to its quorum queue, the last ones "
        f"without an outcome (a crash or a lost connection) after attempt "
        f"{policy.max_attempts} of {policy.max_attempts}",
    )


def _warn_if_row_differs(rec: Receiver, policy: Policy) -> None:
    """A RetryPolicy row (or any policy but the code's) whose delays the queue does not
    give: said once per receiver and process, since the queue keeps the declared ones."""
    declared = code_policy(rec)
    if policy == declared or rec.name in _warned:
        return
    if problems(policy) or native_retry(policy) != native_retry(declared):
        with _warned_lock:
            if rec.name in _warned:
                return
            _warned.add(rec.name)
        logger.warning(
            "%s: its retry policy's delays (%s) differ from those its quorum queue was "
            "declared with (the code's policy): the queue's apply; max attempts and "
            "dont_retry follow the policy",
            rec.name,
            ", ".join(f"{d:g}s" for d in policy.schedule()) or "none",
        )
