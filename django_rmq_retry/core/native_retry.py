"""The quorum-native delay engine's maths: a retry policy as a quorum queue's own delayed
retry. Pure: standard library only.

RabbitMQ 4.3 quorum queues can hold a message given back to them before redelivering it.
With ``x-delayed-retry-type: failed`` a ``basic.reject(requeue=True)`` (or a lost channel)
adds one to the message's ``x-delivery-count`` and the queue waits
``min(x-delayed-retry-min * delivery_count, x-delayed-retry-max)`` milliseconds before it
hands the message out again; a ``basic.nack(requeue=True)`` is neither counted nor delayed,
so our other give-backs (a warm shutdown, a gate) stay immediate. Values the broker does not
understand (another type, a negative or non-integer delay) are accepted at declare and then
silently mean "no delay": every value sent is built here, never taken from a user.

The broker's backoff is linear and capped, one pair of values per queue (per receiver), with
no jitter. A :class:`~.backoff.Policy` fits it when every delay it asks for, in whole
milliseconds, is the broker's delay for the same failure: :func:`native_retry` builds the
pair and :func:`problems` says, for a policy that does not fit, which retry would wait how
long instead. Fitting policies include a fixed delay (``multiplier=1``) and any doubling
policy with at most two retries (1 s then 2 s is linear too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .backoff import Policy

#: The setting's values: our delay levels (the default) or the quorum queue's delayed retry.
CASCADE = "cascade"
QUORUM_NATIVE = "quorum-native"
ENGINES = (CASCADE, QUORUM_NATIVE)

#: Which give-backs the queue delays: only counted ones (reject, a lost channel).
RETRY_TYPE = "failed"
#: The header a quorum queue sets on a redelivery: deliveries given back and counted.
DELIVERY_COUNT = "x-delivery-count"
#: The largest delay we declare, in ms (a signed 32-bit integer, about 24.8 days): larger
#: values are accepted by the broker but their behaviour was never measured.
MAX_ARG_MS = 2**31 - 1
#: The oldest RabbitMQ with the delayed retry (``rmq_doctor`` checks it).
VERSION_FLOOR = (4, 3, 0)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@dataclass(frozen=True)
class NativeRetry:
    """One queue's delayed-retry arguments (milliseconds)."""

    min_ms: int
    max_ms: int

    def arguments(self) -> dict[str, Any]:
        """The queue arguments that declare it."""
        return {
            "x-delayed-retry-type": RETRY_TYPE,
            "x-delayed-retry-min": self.min_ms,
            "x-delayed-retry-max": self.max_ms,
        }

    def delay_ms(self, failures: int) -> int:
        """What the broker waits before the delivery that follows the ``failures``-th
        counted give-back (1-based)."""
        return min(self.min_ms * max(1, failures), self.max_ms)


def native_retry(policy: Policy) -> NativeRetry:
    """The arguments closest to ``policy``: its first delay as the step, its longest delay
    as the cap (:func:`problems` says whether they reproduce it exactly)."""
    schedule = [_ms(d) for d in policy.schedule()] or [_ms(policy.initial_delay)]
    return NativeRetry(min_ms=schedule[0], max_ms=max(schedule))


def problems(policy: Policy) -> list[str]:
    """Why the broker cannot give ``policy``'s delays (empty: it can, exactly)."""
    out: list[str] = []
    if policy.jitter != "none":
        out.append(
            f'jitter "{policy.jitter}" (the broker waits the same time for every message; '
            'set jitter "none")'
        )
    native = native_retry(policy)
    if native.max_ms > MAX_ARG_MS:
        out.append(
            f"a delay of {native.max_ms / 1000:g}s (the longest the engine declares is "
            f"{MAX_ARG_MS / 1000:g}s)"
        )
        return out
    for failures, wanted in enumerate(policy.schedule(), start=1):
        broker = native.delay_ms(failures)
        if _ms(wanted) != broker:
            out.append(
                f"retry {failures} waits {wanted:g}s but the broker's linear backoff (step "
                f"{native.min_ms / 1000:g}s, cap {native.max_ms / 1000:g}s) waits "
                f"{broker / 1000:g}s (multiplier {policy.multiplier:g}: use 1 for a fixed "
                "delay, or at most two retries with 2)"
            )
            break
    return out


def delivery_count(headers: Mapping[str, Any]) -> int:
    """Counted give-backs of this delivery's message, as the quorum queue says (0: none, or
    a value that is not a count)."""
    value = headers.get(DELIVERY_COUNT)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def attempt(header_attempt: int, headers: Mapping[str, Any], most: int) -> int:
    """The attempt a delivery is: our header's attempt (1 unless an operator's requeue or an
    earlier engine set it) plus the queue's counted give-backs, at most ``most``."""
    return min(header_attempt + delivery_count(headers), most)


def honours(native: NativeRetry, failures: int, asked: float) -> bool:
    """Whether ``Retry(delay=asked)`` after the ``failures``-th failure is what the broker
    will wait anyway (to the millisecond): anything else cannot be given."""
    return _ms(asked) == native.delay_ms(failures)
