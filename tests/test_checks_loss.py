"""System checks that refuse settings which would lose messages (issue #12)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_rmq_retry.checks import BROKER_MAX_TTL_MS, check_settings
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.topology_plan import QUORUM_DELIVERY_LIMIT


def _messages(conf):
    with override_settings(RMQ_RETRY=conf):
        return check_settings()


def _ids(conf):
    return [m.id for m in _messages(conf)]


@pytest.mark.parametrize(
    ("conf", "check_id"),
    [
        ({"DELIVERY_LIMIT": QUORUM_DELIVERY_LIMIT}, "django_rmq_retry.E011"),
        ({"DELIVERY_LIMIT": 10**6}, "django_rmq_retry.E011"),
        ({"PREFIX": "x-app"}, "django_rmq_retry.E012"),
        ({"PREFIX": "X-App"}, "django_rmq_retry.E012"),
        ({"PREFIX": "amq"}, "django_rmq_retry.E012"),
        ({"PREFIX": "amq.app"}, "django_rmq_retry.E012"),
        ({"DELAY_RESOLUTION_MS": 1000, "DELAY_LEVELS": 24}, "django_rmq_retry.E013"),
        ({"DELAY_LEVELS": 32}, "django_rmq_retry.E013"),
    ],
)
def test_settings_that_would_lose_messages_are_refused_with_a_hint(conf, check_id):
    messages = [m for m in _messages(conf) if m.id == check_id]
    assert len(messages) == 1, _ids(conf)
    assert messages[0].is_serious() and messages[0].hint


@pytest.mark.parametrize(
    "conf",
    [
        {"DELIVERY_LIMIT": QUORUM_DELIVERY_LIMIT - 1},
        {"PREFIX": "app-x"},
        {"PREFIX": "amqp_events"},
        {"PREFIX": "my.x-app"},
        # the largest level's TTL is exactly the broker's limit's neighbour from below
        {"DELAY_RESOLUTION_MS": 2, "DELAY_LEVELS": 31},
    ],
)
def test_the_edges_just_inside_pass(conf):
    ids = _ids(conf)
    assert not [i for i in ids if i in {f"django_rmq_retry.E01{n}" for n in (1, 2, 3)}], ids


def test_the_ttl_bound_is_the_brokers_unsigned_32_bit_limit():
    assert BROKER_MAX_TTL_MS == 4_294_967_295
    assert DelayLevels(2, 31).ttl_ms(30) <= BROKER_MAX_TTL_MS < DelayLevels(2, 32).ttl_ms(31)
    assert "django_rmq_retry.E013" in _ids({"DELAY_RESOLUTION_MS": 2, "DELAY_LEVELS": 32})
