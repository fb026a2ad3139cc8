"""The quorum-native delay engine without a broker: a policy as queue arguments, what the
system check refuses, the reject frame, the plan and the in-memory model of the engine.

The real 4.3 broker's side is ``test_quorum_native_broker.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
from django.conf import settings
from django.test import override_settings

from django_rmq_retry import Retry, Topic, receiver
from django_rmq_retry.checks.delay_engine import check_delay_engine
from django_rmq_retry.conf import current_plan
from django_rmq_retry.consumer.acks import AckBook, Frame
from django_rmq_retry.core.backoff import Policy
from django_rmq_retry.core.native_retry import (
    MAX_ARG_MS,
    NativeRetry,
    attempt,
    delivery_count,
    honours,
    native_retry,
    problems,
)
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import default_registry, dotted_path
from django_rmq_retry.testing import InMemoryBroker

LINEAR = {"max_attempts": 3, "initial_delay": 1.0, "multiplier": 2.0, "max_delay": 60.0}


def _policy(**kw: object) -> Policy:
    return Policy.from_mapping({"jitter": "none", **kw})


def native_settings(**extra: object) -> dict:
    return {
        **settings.RMQ_RETRY,
        "DELAY_ENGINE": "quorum-native",
        "QUEUE_TYPE": "quorum",
        "RETRY": {**LINEAR, "jitter": "none"},
        **extra,
    }


# The mapping --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # a fixed delay: step = cap
        (_policy(max_attempts=5, initial_delay=5, multiplier=1), NativeRetry(5000, 5000)),
        # doubling, two retries: 1 s then 2 s is linear
        (_policy(max_attempts=3, initial_delay=1, multiplier=2), NativeRetry(1000, 2000)),
        # doubling capped at its second delay: 1, 2, 2, 2
        (
            _policy(max_attempts=5, initial_delay=1, multiplier=2, max_delay=2),
            NativeRetry(1000, 2000),
        ),
        # no retry at all: the first delay, never used
        (_policy(max_attempts=1, initial_delay=0.25), NativeRetry(250, 250)),
    ],
)
def test_a_fitting_policy_becomes_the_queue_arguments_that_reproduce_it(policy, expected):
    native = native_retry(policy)
    assert native == expected
    assert problems(policy) == []
    # the broker's delay after each counted give-back is the policy's, to the millisecond
    assert [native.delay_ms(n) for n in range(1, policy.max_attempts)] == [
        round(d * 1000) for d in policy.schedule()
    ]
    assert native.arguments() == {
        "x-delayed-retry-type": "failed",
        "x-delayed-retry-min": expected.min_ms,
        "x-delayed-retry-max": expected.max_ms,
    }


def test_an_exponential_policy_is_named_at_the_retry_the_broker_would_change():
    why = problems(_policy(max_attempts=5, initial_delay=1, multiplier=2, max_delay=60))
    assert len(why) == 1
    assert "retry 3 waits 4s" in why[0] and "waits 3s" in why[0], why


def test_jitter_and_a_delay_past_what_the_arguments_hold_are_refused():
    jittered = Policy.from_mapping({**LINEAR, "jitter": "full"})
    assert any('jitter "full"' in p for p in problems(jittered))
    too_long = _policy(max_attempts=2, initial_delay=MAX_ARG_MS / 1000 + 1, max_delay=1e9)
    assert any("longest the engine declares" in p for p in problems(too_long))


def test_the_attempt_is_our_header_plus_the_queues_count_and_a_forged_count_is_ignored():
    assert attempt(1, {}, 100) == 1
    assert attempt(1, {"x-delivery-count": 2}, 100) == 3
    assert attempt(2, {"x-delivery-count": 1}, 100) == 3  # an operator's requeue said 2
    assert attempt(1, {"x-delivery-count": 10**9}, 100) == 100
    for junk in (-1, "2", True, 1.5, None):
        assert delivery_count({"x-delivery-count": junk}) == 0


def test_a_retry_delay_is_honoured_only_when_it_is_the_brokers():
    native = NativeRetry(1000, 2000)
    assert honours(native, 1, 1.0)
    assert honours(native, 2, 2.0)
    assert not honours(native, 1, 5.0)


# The system check ---------------------------------------------------------------------------
def _for(receiver_name: str, messages: list) -> list[str]:
    return [m.msg for m in messages if receiver_name in m.msg]


def test_the_cascade_default_is_never_refused():
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY}):
        assert check_delay_engine() == []


def test_an_unknown_engine_is_refused():
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "DELAY_ENGINE": "plugin"}):
        (error,) = check_delay_engine()
    assert error.id == "django_rmq_retry.E051"
    assert "'plugin'" in error.msg


def test_quorum_native_on_classic_queues_is_refused():
    with override_settings(RMQ_RETRY=native_settings(QUEUE_TYPE="classic")):
        messages = check_delay_engine()
    assert [m.id for m in messages if "QUEUE_TYPE" in m.msg] == ["django_rmq_retry.E051"]


def test_each_receiver_whose_policy_does_not_fit_is_named_with_why():
    with override_settings(RMQ_RETRY=native_settings()):
        messages = check_delay_engine()
    alpha = default_registry.find("alpha", "x")
    gamma = default_registry.find("gamma", "x")
    assert alpha is not None and gamma is not None
    assert _for(alpha.name + "'", messages) == []  # the linear RETRY fits
    (why,) = _for(gamma.name + "'", messages)  # its own policy multiplies by 1.5
    assert "multiplier 1.5" in why
    assert all(m.id == "django_rmq_retry.E051" and m.hint for m in messages)
    # the default RETRY (jittered, doubling five times) names every receiver that uses it
    with override_settings(RMQ_RETRY=native_settings(RETRY={"max_attempts": 5})):
        assert 'jitter "full"' in _for(alpha.name + "'", check_delay_engine())[0]


def test_an_ordered_receiver_needs_the_cascade(registry_snapshot):
    @receiver(Topic("qn.ordered"), ordering_key="id")
    def ordered(message, **kwargs):
        pass

    with override_settings(RMQ_RETRY=native_settings()):
        assert any("per-key order" in m for m in _for("ordered", check_delay_engine()))


# The plan and the reject frame --------------------------------------------------------------
def test_receiver_queues_carry_the_delayed_retry_arguments_only_under_quorum_native():
    alpha = default_registry.find("alpha", "x")
    assert alpha is not None
    with override_settings(RMQ_RETRY=native_settings(PREFIX="qn")):
        spec = next(q for q in current_plan([alpha]).queues if q.receiver == alpha.name)
        assert spec.arguments["x-delayed-retry-type"] == "failed"
        assert (spec.arguments["x-delayed-retry-min"], spec.arguments["x-delayed-retry-max"]) == (
            1000,
            2000,
        )
    with override_settings(RMQ_RETRY={**native_settings(PREFIX="qn"), "DELAY_ENGINE": "cascade"}):
        spec = next(q for q in current_plan([alpha]).queues if q.receiver == alpha.name)
        assert "x-delayed-retry-type" not in spec.arguments


def test_a_retry_in_place_is_a_reject_frame_sent_before_the_acks_behind_it():
    book = AckBook()
    for tag in (1, 2, 3):
        book.delivered(tag)
    assert book.reject(2)
    book.ack(1)
    book.ack(3)
    assert book.flush() == [Frame(2, nack=True, requeue=True, reject=True), Frame(3, multiple=True)]
    assert not book.reject(2)  # settled once


# The in-memory broker models it -------------------------------------------------------------
@pytest.mark.django_db
def test_the_in_memory_broker_holds_retries_as_the_quorum_queue_does(registry_snapshot):
    topic = Topic("qn.memory")
    answers = [TimeoutError("down"), TimeoutError("down"), None]

    @receiver(topic)
    def flaky(message, **kwargs):
        if (error := answers.pop(0)) is not None:
            raise error

    @receiver(topic)
    def asks_for_another_delay(message, **kwargs):
        raise Retry(delay=5)

    with override_settings(RMQ_RETRY=native_settings()), InMemoryBroker() as broker:
        topic.send({"n": 1})
        runs = broker.run_until_idle()
    mine = [(r.attempt, r.outcome, r.delay) for r in runs if r.receiver == dotted_path(flaky)]
    assert mine == [(1, "retried", 1.0), (2, "retried", 2.0), (3, "handled", None)]
    (row,) = ParkedMessage.objects.all()
    assert row.receiver == dotted_path(asks_for_another_delay)
    assert "Retry(delay=5) cannot be given" in row.reason_detail


def test_a_delivery_past_the_last_attempt_is_parked_unrun():
    from django_rmq_retry.consumer.native_retry import counted_by_queue, past_last_attempt
    from django_rmq_retry.core.envelope import read_incoming
    from django_rmq_retry.core.names import Names

    policy = _policy(max_attempts=3, initial_delay=1)
    env = read_incoming({}, "x.work", "k", Names("x"))
    for count, parks in ((0, False), (2, False), (3, True)):
        headers = {"x-delivery-count": count}
        at = dataclasses.replace(env, attempt=attempt(1, headers, 100))
        verdict = past_last_attempt(at, policy, headers)
        assert (verdict is not None) is parks, (count, verdict)
        assert counted_by_queue(headers) is (count > 0)
    assert verdict is not None and verdict.reason.value == "delivery_limit"
    assert "given back 3 times" in verdict.detail


def test_rmq_doctor_holds_the_engine_to_rabbitmq_4_3():
    from django_rmq_retry.management.doctor import _delay_engine

    with override_settings(RMQ_RETRY=native_settings()):
        (old,) = _delay_engine("4.0.5")
        (new,) = _delay_engine("4.3.6")
    assert not old.ok and "older than 4.3.0" in old.what and "cascade" in old.fix
    assert new.ok
    assert _delay_engine("3.10.8") == []  # the cascade needs no floor of its own


@pytest.mark.django_db
def test_a_policy_row_sets_attempts_but_the_queues_delays_stay_and_it_is_said(
    registry_snapshot, caplog
):
    from django_rmq_retry.models import RetryPolicy
    from django_rmq_retry.registry.policies import policy_cache

    topic = Topic("qn.row")

    @receiver(topic)
    def always_fails(message, **kwargs):
        raise TimeoutError("down")

    RetryPolicy.objects.create(
        receiver=dotted_path(always_fails),
        max_attempts=4,
        initial_delay=30,
        multiplier=3,
        max_delay=600,
        jitter="none",
    )
    policy_cache.invalidate()
    try:
        with override_settings(RMQ_RETRY=native_settings()), InMemoryBroker() as broker:
            topic.send({"n": 1})
            runs = broker.run_until_idle()
    finally:
        policy_cache.invalidate()
    # four attempts (the row's), waits of 1 s, 2 s, 2 s (the queue's, from the code's policy)
    assert [(r.attempt, r.outcome, r.delay) for r in runs] == [
        (1, "retried", 1.0),
        (2, "retried", 2.0),
        (3, "retried", 2.0),
        (4, "parked", None),
    ]
    said = [r for r in caplog.records if "differ from those its quorum queue" in r.getMessage()]
    assert len(said) == 1
