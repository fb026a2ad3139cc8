"""Pure tests of the delay-level routing (the binary routing key through TTL levels)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from django_rmq_retry.core.delays import DelayLevels

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
