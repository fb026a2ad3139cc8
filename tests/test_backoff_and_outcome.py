"""Pure tests of the backoff maths and the retry-or-park decision (no broker, no database)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_rmq_retry.core.backoff import (
    CappedBackoff,
    Policy,
    matches,
    pauses_within,
    policy_errors,
)
from django_rmq_retry.core.errors import Reject, Retry
from django_rmq_retry.core.outcome import Park, ParkReason, RetryLater, decide


def test_exponential_schedule_is_capped():
    p = Policy(max_attempts=6, initial_delay=1, multiplier=3, max_delay=20, jitter="none")
    assert p.schedule() == [1, 3, 9, 20, 20]


@given(
    attempt=st.integers(min_value=1, max_value=10_000),
    initial=st.floats(min_value=0, max_value=1e4),
    multiplier=st.floats(min_value=1, max_value=100),
    extra=st.floats(min_value=0, max_value=1e6),
    jitter=st.sampled_from(["none", "full", "equal"]),
    seed=st.integers(),
)
def test_delay_always_within_bounds(attempt, initial, multiplier, extra, jitter, seed):
    p = Policy(
        max_attempts=3,
        initial_delay=initial,
        multiplier=multiplier,
        max_delay=initial + extra,
        jitter=jitter,
    )
    base = p.base_delay(attempt)
    assert 0 <= base <= p.max_delay
    d = p.delay(attempt, random.Random(seed))
    if jitter == "none":
        assert d == base
    elif jitter == "full":
        assert 0 <= d <= base
    else:
        assert base / 2 <= d <= base


@given(st.integers(min_value=1, max_value=60))
def test_base_delay_never_decreases(attempt):
    p = Policy(initial_delay=0.5, multiplier=2, max_delay=300, jitter="none")
    assert p.base_delay(attempt + 1) >= p.base_delay(attempt)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"initial_delay": -1}, "initial_delay"),
        ({"max_delay": 0.5, "initial_delay": 1}, "max_delay must be >= initial_delay"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": "sometimes"}, "jitter"),
    ],
)
def test_invalid_policies_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Policy(**kwargs)


def test_policy_errors_lists_every_problem():
    assert len(policy_errors(0, -1, 0, -2, "x")) == 6


def test_from_mapping_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown retry policy keys: attempts"):
        Policy.from_mapping({"attempts": 3})


class NotFound(Exception):
    pass


def test_matches_classes_and_dotted_paths():
    exc = NotFound()
    assert matches(exc, [NotFound])
    assert matches(exc, [Exception])
    assert matches(exc, [f"{__name__}.NotFound"])
    assert matches(KeyError(), ["builtins.LookupError"])
    assert not matches(exc, [KeyError, "builtins.KeyError"])


POLICY = Policy(max_attempts=3, initial_delay=1, multiplier=2, max_delay=10, jitter="none")


def test_failure_before_the_last_attempt_retries_with_backoff():
    assert decide(1, ValueError(), POLICY) == RetryLater(delay=1, next_attempt=2)
    assert decide(2, ValueError(), POLICY) == RetryLater(delay=2, next_attempt=3)


def test_last_attempt_parks_as_exhausted():
    d = decide(3, ValueError(), POLICY)
    assert isinstance(d, Park) and d.reason is ParkReason.EXHAUSTED
    assert "3 times" in d.detail


def test_attempt_beyond_max_still_parks():
    assert isinstance(decide(1000, ValueError(), POLICY), Park)


def test_reject_parks_at_once():
    d = decide(1, Reject("no such order"), POLICY)
    assert d == Park(ParkReason.REJECTED, "no such order")


def test_non_retryable_exceptions_park_at_once():
    p = POLICY.replace(dont_retry=(KeyError,))
    d = decide(1, KeyError("x"), p)
    assert isinstance(d, Park) and d.reason is ParkReason.NON_RETRYABLE


def test_retry_with_explicit_delay_is_honoured_but_bounded_by_attempts():
    assert decide(1, Retry(delay=42), POLICY) == RetryLater(delay=42, next_attempt=2)
    assert isinstance(decide(3, Retry(delay=42), POLICY), Park)


def test_delay_is_clamped_to_what_the_topology_can_hold():
    assert decide(1, Retry(delay=10**9), POLICY, max_delay=100).delay == 100


def test_retry_refuses_negative_delay():
    with pytest.raises(ValueError):
        Retry(delay=-1)


@given(
    attempt=st.integers(min_value=1, max_value=50),
    max_attempts=st.integers(min_value=1, max_value=50),
)
def test_a_message_is_handled_exactly_max_attempts_times(attempt, max_attempts):
    """Walking the decisions from attempt 1 always parks after exactly max_attempts tries."""
    p = Policy(max_attempts=max_attempts, initial_delay=0, max_delay=0, jitter="none")
    tries, a = 0, 1
    while True:
        tries += 1
        d = decide(a, RuntimeError(), p)
        if isinstance(d, Park):
            break
        a = d.next_attempt
    assert tries == max_attempts


def test_the_give_back_budget_parks_at_the_limit_naming_the_last_cause():
    from django_rmq_retry.core.budget import UNSEEN_CAUSE, copy_refused, over_budget

    assert over_budget(4, 5, copy_refused("nacked by the broker")) is None
    park = over_budget(5, 5, copy_refused("nacked by the broker"))
    assert park is not None and park.reason is ParkReason.DELIVERY_LIMIT
    assert park.detail == (
        "given back 5 times without finishing (limit 5); "
        "last: the broker refused its retry copy (nacked by the broker)"
    )
    unseen = over_budget(7, 5, None)
    assert unseen is not None and unseen.detail.endswith(UNSEEN_CAUSE)


def test_capped_backoff_doubles_to_its_cap_and_the_cap_holds_from_the_first_wait():
    backoff = CappedBackoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5
    below = CappedBackoff(0.5, 0.2)  # RECONNECT_MAX_DELAY = 0.2: never a 0.5 s wait
    assert [below.next() for _ in range(3)] == [0.2, 0.2, 0.2]


def test_pauses_within_double_to_the_cap_and_add_up_to_the_total():
    assert pauses_within(20) == (0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 2.5)
    assert pauses_within(1.5) == (0.5, 1.0)
    assert pauses_within(0) == ()


@given(total=st.floats(min_value=0, max_value=1e3), cap=st.floats(min_value=0.1, max_value=60))
def test_pauses_within_never_exceed_the_cap_or_the_total(total, cap):
    pauses = pauses_within(total, start=0.5, cap=cap)
    assert sum(pauses) == pytest.approx(total, abs=1e-6)
    assert all(0 < p <= cap for p in pauses)
