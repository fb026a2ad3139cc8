"""From a delay to a route through the delay levels. Pure: standard library only.

Level ``k`` is a queue whose per-queue TTL is ``resolution * 2**k`` and which dead-letters
into the exchange of level ``k - 1`` (level 0 into the deliver exchange). Every message in one
level's queue has the same TTL, so expiry order is arrival order and a short delay never waits
behind a long one. The routing key spells the delay in binary, most significant level first,
one word per level (``"0.1.1"`` for 3 units with 3 levels); level ``k``'s exchange sends the
message into its queue if bit ``k`` is 1 and straight on to level ``k - 1`` if it is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import TypeGuard

from .names import Names

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class DelayPlan:
    """Where to publish a message that must wait ``units * resolution_ms``."""

    units: int
    first_level: int | None  # None: no wait, publish straight to the deliver exchange
    routing_key: str

    def waits_in(self) -> list[int]:
        """Levels whose queues the message will sit in, in order (highest first)."""
        bits = self.routing_key.split(".")
        n = len(bits)
        return [n - 1 - i for i, b in enumerate(bits) if b == "1"]


@dataclass(frozen=True)
class DelayLevels:
    resolution_ms: int
    levels: int

    def __post_init__(self) -> None:
        if self.resolution_ms < 1:
            raise ValueError("delay resolution must be >= 1 ms")
        if not 1 <= self.levels <= 32:
            raise ValueError("delay levels must be between 1 and 32")

    @property
    def max_units(self) -> int:
        return (1 << self.levels) - 1

    @property
    def max_delay_ms(self) -> int:
        return self.max_units * self.resolution_ms

    def ttl_ms(self, level: int) -> int:
        return self.resolution_ms << level

    def units_for(self, delay_ms: float) -> int:
        """Round to the nearest unit; clamp to what the levels can hold."""
        if delay_ms <= 0:
            return 0
        units = int(delay_ms / self.resolution_ms + 0.5)
        return min(max(units, 0), self.max_units)

    def plan(self, delay_ms: float) -> DelayPlan:
        return self._plan(self.units_for(delay_ms))

    @lru_cache(maxsize=1024)  # noqa: B019 (frozen and hashable; a few distinct delays)
    def _plan(self, units: int) -> DelayPlan:
        key = ".".join("1" if units >> k & 1 else "0" for k in reversed(range(self.levels)))
        first = units.bit_length() - 1 if units else None
        return DelayPlan(units=units, first_level=first, routing_key=key)

    def binding_key(self, level: int, bit: str) -> str:
        """Topic pattern matching keys whose bit for ``level`` is ``bit`` (exact word count)."""
        words = ["*"] * self.levels
        words[self.levels - 1 - level] = bit
        return ".".join(words)


@dataclass(frozen=True)
class RetryRoute:
    """Where a retry copy is published, and when it will come back."""

    exchange: str
    routing_key: str
    delay_ms: int  # the whole delay, rounded to the resolution and clamped
    due_us: int  # epoch microseconds when the copy's receiver should run it
    landing_ms: int = 0  # the part of the delay left to the consumer (``landing``)

    @property
    def due_ms(self) -> int:
        """The due time in whole ms rounded *up* (the header every version reads): never
        before the failure plus the delay, by the clock of the receiver that failed."""
        return ms_rounded_up(self.due_us)


def route(
    levels: DelayLevels, names: Names, delay_s: float, now_us: int, landing_ms: int = 0
) -> RetryRoute:
    """The route of a retry copy that must wait ``delay_s`` seconds, failed at ``now_us``
    (epoch microseconds, ``epoch_us``).

    A copy with no wait skips the levels and goes straight to the deliver exchange.

    With ``landing_ms`` the levels hold the delay less at least ``landing_ms`` (whole units,
    rounded down) and the copy reaches its queue that much early; the consumer holds it
    unacked until ``due_ms`` (``landing_wait``). Every level RabbitMQ crosses adds a little
    time, with a long tail (see bench/README.md): landing early and waiting out the rest in
    the consumer is what puts a retry's receiver on its due time.
    """
    res = levels.resolution_ms
    delay_ms = levels.units_for(delay_s * 1000) * res
    in_levels = max(0, delay_ms - max(0, landing_ms)) // res * res
    plan = levels.plan(in_levels)
    exchange = (
        names.delay_exchange(plan.first_level)
        if plan.first_level is not None
        else names.deliver_exchange
    )
    return RetryRoute(
        exchange, plan.routing_key, delay_ms, now_us + delay_ms * 1000, delay_ms - in_levels
    )


def ms_rounded_up(micros: int) -> int:
    """Whole milliseconds at or after ``micros``: a due header in ms is never early."""
    return -(-micros // 1000)


def epoch_us(moment: datetime) -> int:
    """Whole microseconds from the epoch to ``moment``: exact, no float."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


def landing_wait(due: object, now_ms: float, most_ms: int, due_us: object = None) -> float:
    """Seconds a consumer holds a delivery that arrived before its due time (0: run now).

    ``due`` is the copy's due header (epoch ms) as it arrived: anything but an integer (a
    foreign client's value, none at all) means no wait. ``due_us`` is the same time to the
    microsecond (the ``due-us`` header): taken only when it is an integer that rounds up to
    ``due``, so it can move the wait by less than a millisecond and a copy from an older
    version (no ``due-us``) waits for ``due``. Whole milliseconds would put the copies that
    failed within one millisecond on the same instant, to queue behind each other at the
    receiver thread. ``most_ms`` bounds the wait, so a clock that differs from the
    publisher's, or a due header far ahead, delays a message by at most that much.
    """
    if not _an_int(due):
        return 0.0
    at = float(due)
    if _an_int(due_us) and ms_rounded_up(due_us) == due:
        at = due_us / 1000
    if at <= now_ms:
        return 0.0
    return min(at - now_ms, max(0, most_ms)) / 1000


def _an_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
