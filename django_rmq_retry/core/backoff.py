"""Retry policy and the backoff maths. Pure: standard library only.

Two kinds of waiting live here: a receiver's :class:`Policy` (the delays between attempts of
one message, jittered) and :class:`CappedBackoff` (how long our own loops wait before trying
again: reconnecting, writing parked rows through a database outage, restarting a dead child).

Delays (seconds) for the retry that follows failed attempt ``n`` (1-based)::

    base(n)  = min(max_delay, initial_delay * multiplier ** (n - 1))
    none     : base(n)
    full     : uniform(0, base(n))                  # AWS "full jitter"
    equal    : base(n) / 2 + uniform(0, base(n) / 2)  # AWS "equal jitter"
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

Jitter = Literal["none", "full", "equal"]
JITTERS: tuple[str, ...] = ("none", "full", "equal")


@dataclass(frozen=True)
class Policy:
    """How a receiver retries. Immutable; build variants with :meth:`replace`."""

    max_attempts: int = 5
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 3600.0
    jitter: Jitter = "full"
    #: Exception classes (or dotted paths to them) that park at once, never retried.
    dont_retry: tuple[Any, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        errors = policy_errors(
            self.max_attempts, self.initial_delay, self.multiplier, self.max_delay, self.jitter
        )
        if errors:
            raise ValueError("; ".join(errors))
        if not isinstance(self.dont_retry, tuple):
            object.__setattr__(self, "dont_retry", tuple(self.dont_retry))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Policy:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown retry policy keys: {', '.join(sorted(unknown))}")
        values = dict(data)
        if "dont_retry" in values:
            values["dont_retry"] = tuple(values["dont_retry"] or ())
        return cls(**values)

    def replace(self, **changes: Any) -> Policy:
        return replace(self, **changes)

    def base_delay(self, attempt: int) -> float:
        """Un-jittered delay after failed attempt ``attempt`` (1-based), capped."""
        exponent = max(0, attempt - 1)
        try:
            raw = self.initial_delay * self.multiplier**exponent
        except OverflowError:
            raw = math.inf
        return min(self.max_delay, raw)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Delay in seconds before the attempt after ``attempt``, jitter applied."""
        base = self.base_delay(attempt)
        uniform = (rng or random).uniform
        if self.jitter == "full":
            return uniform(0.0, base)
        if self.jitter == "equal":
            return base / 2 + uniform(0.0, base / 2)
        return base

    def schedule(self) -> list[float]:
        """Un-jittered delays of every retry this policy allows (for docs and ``--list``)."""
        return [self.base_delay(n) for n in range(1, self.max_attempts)]


def policy_errors(
    max_attempts: Any, initial_delay: Any, multiplier: Any, max_delay: Any, jitter: Any
) -> list[str]:
    """Readable problems with a policy's values; shared by the dataclass and the model."""
    errors: list[str] = []
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
        errors.append("max_attempts must be an integer >= 1")
    for name, value in (("initial_delay", initial_delay), ("max_delay", max_delay)):
        if not _is_number(value) or value < 0:
            errors.append(f"{name} must be a number of seconds >= 0")
    if not _is_number(multiplier) or multiplier < 1:
        errors.append("multiplier must be a number >= 1")
    if _is_number(initial_delay) and _is_number(max_delay) and max_delay < initial_delay:
        errors.append("max_delay must be >= initial_delay")
    if jitter not in JITTERS:
        errors.append(f"jitter must be one of {', '.join(JITTERS)}")
    return errors


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def matches(exc: BaseException, classes: Iterable[Any]) -> bool:
    """True if ``exc`` is an instance of one of ``classes`` (classes or dotted paths)."""
    mro_names = {f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__}
    for item in classes:
        if isinstance(item, str):
            if item in mro_names:
                return True
        elif isinstance(item, type) and isinstance(exc, item):
            return True
    return False


@dataclass
class CappedBackoff:
    """Waits that start at ``start`` seconds and double up to ``cap``; :meth:`reset` starts over.

    The one backoff of every loop of ours that tries again (consumer reconnects, the parking
    thread during a database outage, the supervisor restarting a child), so none of them
    hammers what is down and each recovers at once when it is back. The cap holds from the
    first wait: ``RECONNECT_MAX_DELAY`` of 0.2 s means 0.2 s, not a first 0.5 s.
    """

    start: float = 0.5
    cap: float = 30.0
    current: float = field(init=False)

    def __post_init__(self) -> None:
        self.current = self.start

    def next(self) -> float:
        """The wait before this try; the one after doubles (capped)."""
        wait = min(self.cap, self.current)
        self.current = min(self.cap, self.current * 2)
        return wait

    def reset(self) -> None:
        self.current = self.start


def pauses_within(total: float, start: float = 0.5, cap: float = 5.0) -> tuple[float, ...]:
    """Pauses that start at ``start``, double up to ``cap`` and add up to ``total`` exactly.

    For trying again something the other side refused *for now* (a nacked publish while a
    quorum queue elects a leader): short pauses catch a quick recovery, the cap keeps a long
    one from being waited out in one sleep, and ``total`` is the longest a caller is held.
    """
    pauses: list[float] = []
    left = float(total)
    backoff = CappedBackoff(start, cap)
    while left > 1e-9:
        pause = min(backoff.next(), left)
        pauses.append(pause)
        left -= pause
    return tuple(pauses)
