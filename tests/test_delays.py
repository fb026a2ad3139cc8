"""Pure tests of the delay-level routing (the binary routing key through TTL levels)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_rmq_retry.core.delays import DelayLevels, epoch_us, landing_wait, route
from django_rmq_retry.core.names import Names

LEVELS = DelayLevels(resolution_ms=100, levels=23)


def test_default_levels_hold_more_than_seven_days():
    assert LEVELS.max_delay_ms >= 7 * 24 * 3600 * 1000


def test_plan_for_1_3_seconds():
    plan = LEVELS.plan(1300)  # 13 units = 0b1101
    assert plan.units == 13
    assert plan.routing_key.endswith("1.1.0.1")
    assert plan.first_level == 3
    assert plan.waits_in() == [3, 2, 0]


def test_zero_delay_skips_the_levels():
    plan = LEVELS.plan(0)
    assert plan.first_level is None and plan.units == 0


def _topic_match(pattern: str, key: str) -> bool:
    """RabbitMQ topic matching for patterns made only of '*' and literal words."""
    p, k = pattern.split("."), key.split(".")
    return len(p) == len(k) and all(a == "*" or a == b for a, b in zip(p, k, strict=True))


@given(st.floats(min_value=0, max_value=LEVELS.max_delay_ms))
def test_route_waits_the_requested_time_within_half_a_unit(delay_ms):
    """Simulate the cascade: the sum of TTLs of the queues a message waits in is the delay."""
    plan = LEVELS.plan(delay_ms)
    waited = 0
    level = plan.first_level
    while level is not None and level >= 0:
        to_queue = _topic_match(LEVELS.binding_key(level, "1"), plan.routing_key)
        to_next = _topic_match(LEVELS.binding_key(level, "0"), plan.routing_key)
        assert to_queue != to_next  # exactly one route at every level
        if to_queue:
            waited += LEVELS.ttl_ms(level)
        level -= 1
    assert abs(waited - delay_ms) <= LEVELS.resolution_ms / 2 + 1e-6


def test_delays_beyond_the_longest_are_clamped():
    assert LEVELS.plan(10**15).units == LEVELS.max_units


def test_binding_keys_have_no_hash_wildcard():
    """'#' would let a key of a different length match: every pattern has exactly N words."""
    for k in range(LEVELS.levels):
        key = LEVELS.binding_key(k, "1")
        assert "#" not in key and len(key.split(".")) == LEVELS.levels
        assert re.fullmatch(r"(\*|1)(\.(\*|1))*", key)


NAMES = Names("p")


@given(
    st.floats(min_value=0, max_value=LEVELS.max_delay_ms / 1000),
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=1, max_value=1_000),
)
def test_a_landing_leaves_the_consumer_at_least_its_length_and_less_than_a_unit_more(
    delay_s, landing_ms, resolution_ms
):
    """The levels hold whole units of the delay less the landing; the due time is unchanged."""
    levels = DelayLevels(resolution_ms=resolution_ms, levels=16)
    whole = route(levels, NAMES, delay_s, now_us=1_000_000)
    landed = route(levels, NAMES, delay_s, now_us=1_000_000, landing_ms=landing_ms)
    assert (landed.delay_ms, landed.due_ms) == (whole.delay_ms, whole.due_ms)
    in_levels = levels.plan(landed.delay_ms - landed.landing_ms).units * resolution_ms
    assert in_levels + landed.landing_ms == landed.delay_ms
    if whole.delay_ms <= landing_ms:  # all of it held by the consumer: no level at all
        assert landed.landing_ms == whole.delay_ms
        assert landed.exchange == NAMES.deliver_exchange
    else:
        assert landing_ms <= landed.landing_ms < landing_ms + resolution_ms
    if landing_ms == 0:
        assert landed == whole


def test_a_one_second_retry_with_the_default_landing_waits_900_ms_in_the_levels():
    way = route(LEVELS, NAMES, 1.0, now_us=0, landing_ms=50)
    assert (way.delay_ms, way.due_ms, way.landing_ms) == (1000, 1000, 100)
    assert LEVELS.plan(900).routing_key == way.routing_key  # levels 3 and 0: 800 + 100 ms
    assert way.exchange == NAMES.delay_exchange(3)


@pytest.mark.parametrize(
    ("due", "now_ms", "most_ms", "wait"),
    [
        (1_250, 1_000, 500, 0.25),  # early: wait for the rest
        (1_000, 1_000, 500, 0.0),  # on time
        (900, 1_000, 500, 0.0),  # late: run now
        (10**12, 1_000, 500, 0.5),  # far ahead (a skewed clock, a foreign header): capped
        (1_250, 1_000, 0, 0.0),
        ("1250", 1_000, 500, 0.0),  # not ours: no wait
        (1_250.0, 1_000, 500, 0.0),
        (True, 0, 500, 0.0),
        (None, 1_000, 500, 0.0),
    ],
)
def test_landing_wait_holds_only_early_integer_due_times_and_never_past_the_cap(
    due, now_ms, most_ms, wait
):
    assert landing_wait(due, now_ms, most_ms) == wait


@pytest.mark.parametrize(
    ("due", "due_us", "now_ms", "wait"),
    [
        (1_250, 1_249_400, 1_000, 0.2494),  # the µs header, when it rounds up to the ms one
        (1_250, 1_250_000, 1_000, 0.25),
        (1_250, 1_248_999, 1_000, 0.25),  # not the same time: the ms header alone
        (1_250, 1_250_001, 1_000, 0.25),
        (1_250, 1_249_400.0, 1_000, 0.25),  # not an integer: ignored
        (1_250, True, 1_000, 0.25),
        (1_250, None, 1_000, 0.25),  # an older version's copy
        (None, 1_249_400, 1_000, 0.0),  # no ms header: not a copy of ours, no wait
        (1_001, 1_000_400, 1_000.5, 0.0),  # due by the µs though not by the ms: run now
    ],
)
def test_landing_wait_takes_the_microseconds_only_beside_the_ms_they_round_to(
    due, due_us, now_ms, wait
):
    assert landing_wait(due, now_ms, 500, due_us) == pytest.approx(wait, abs=1e-9)


@pytest.mark.parametrize(
    ("moment", "ms"),
    [
        (datetime(2026, 1, 1, 0, 0, 0, 0, tzinfo=timezone.utc), 1_767_225_600_000),
        (datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc), 1_767_225_600_001),
        (datetime(2026, 1, 1, 0, 0, 0, 999, tzinfo=timezone.utc), 1_767_225_600_001),
        (datetime(2026, 1, 1, 0, 0, 0, 1000, tzinfo=timezone.utc), 1_767_225_600_001),
        (datetime(2026, 1, 1, 0, 0, 0, 1001, tzinfo=timezone.utc), 1_767_225_600_002),
    ],
)
def test_the_due_ms_header_rounds_the_failure_up_so_a_copy_is_never_early(moment, ms):
    way = route(LEVELS, NAMES, 1.0, now_us=epoch_us(moment))
    assert way.due_ms == ms + 1_000
    assert way.due_us == epoch_us(moment) + 1_000_000 <= way.due_ms * 1000
