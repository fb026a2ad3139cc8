"""The quorum-native delay engine against a real RabbitMQ 4.3 (the rabbit43 leg).

A receiver's quorum queue holds its retries (``x-delayed-retry-*``): a failed attempt is
given back with ``basic.reject`` and comes back after the policy's delay, its attempt
counted by the broker. The policy (``tests/quorum_native_settings.py``) waits 1 s, then 2 s,
for three attempts at most.
"""

from __future__ import annotations

import pika
import pytest
from django.conf import settings
from django.test import override_settings

from django_rmq_retry.models import ParkedMessage
from tests.conftest import read_log, start_consumer, wait_for
from tests.quorum_native_settings import NATIVE
from tests.testapp.events import work

pytestmark = [
    pytest.mark.broker,
    pytest.mark.rabbit43,
    pytest.mark.undeclared,
    pytest.mark.django_db(transaction=True),
]

CHILD = {"DJANGO_SETTINGS_MODULE": "tests.quorum_native_settings", "RMQ_QUEUE_TYPE": "quorum"}


@pytest.fixture
def native_prefix(rmq):
    """The test's prefix declared with quorum queues that hold retries."""
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "PREFIX": rmq.prefix, **NATIVE}):
        rmq.setup()
        yield rmq


@pytest.fixture
def native(native_prefix):
    """The same, and a consumer of ``alpha`` under that engine."""
    rmq = native_prefix
    proc = start_consumer(rmq.prefix, rmq.log, "alpha", **CHILD)
    rmq.proc = proc
    try:
        yield rmq
    finally:
        proc.terminate()
        rmq.out, _ = proc.communicate(timeout=60)


def _alpha(rmq, event: str, id_: str) -> list[dict]:
    return [
        e
        for e in read_log(rmq.log)
        if e["event"] == event and e["id"] == id_ and e["receiver"] == "alpha"
    ]


def test_the_queue_declares_the_delayed_retry_of_the_policy(native):
    """Declared again with the policy's arguments the queue is accepted; with another step
    it is refused (406): the broker holds these very values."""
    args = {
        "x-queue-type": "quorum",
        "x-delivery-limit": 1000,
        "x-dead-letter-exchange": native.names.dead_exchange,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-delayed-retry-type": "failed",
        "x-delayed-retry-min": 1000,
        "x-delayed-retry-max": 2000,
    }
    native.ch().queue_declare(native.queue("alpha"), durable=True, arguments=args)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        native.ch().queue_declare(
            native.queue("alpha"), durable=True, arguments={**args, "x-delayed-retry-min": 999}
        )
    assert refused.value.reply_code == 406


def test_failing_twice_then_succeeding_waits_the_brokers_delays_with_exact_attempts(native):
    work.send({"id": "twice", "fail": 2, "only": ["alpha"]})
    assert wait_for(lambda: _alpha(native, "done", "twice"), 60), native.proc.output()
    starts = _alpha(native, "start", "twice")
    assert [s["attempt"] for s in starts] == [1, 2, 3], starts
    # held by the queue: never earlier than the policy's delays (1 s, then 2 s)
    assert starts[1]["t"] - starts[0]["t"] >= 1.0, starts
    assert starts[2]["t"] - starts[1]["t"] >= 2.0, starts
    assert wait_for(lambda: native.depth(native.queue("alpha")) == 0, 30)
    assert not ParkedMessage.objects.exists()
    assert "held by its quorum queue" in native.proc.output()


def test_the_last_attempt_parks(native):
    work.send({"id": "always", "fail": "always", "only": ["alpha"]})
    assert wait_for(lambda: ParkedMessage.objects.exists(), 60), native.proc.output()
    row = ParkedMessage.objects.get()
    assert row.reason == "exhausted", row.reason_detail
    assert [s["attempt"] for s in _alpha(native, "start", "always")] == [1, 2, 3]
    assert wait_for(lambda: native.depth(native.queue("alpha")) == 0, 30)


def test_a_retry_delay_the_queue_cannot_give_parks_and_says_why(native):
    work.send({"id": "asks", "fail": 1, "retry_delay": 7, "only": ["alpha"]})
    assert wait_for(lambda: ParkedMessage.objects.exists(), 60), native.proc.output()
    row = ParkedMessage.objects.get()
    assert row.reason == "non_retryable"
    assert "Retry(delay=7) cannot be given" in row.reason_detail
    assert [s["attempt"] for s in _alpha(native, "start", "asks")] == [1]


def test_a_message_that_kills_its_consumer_each_time_is_parked_unrun_after_the_last_attempt(
    native_prefix,
):
    """Each death hands the message back with the connection: the queue counts it as an
    attempt (and holds it). Past the last attempt it is parked before its receiver runs."""
    rmq = native_prefix
    work.send({"id": "killer", "exit": 99, "only": ["alpha"]})
    for _ in range(6):
        proc = start_consumer(rmq.prefix, rmq.log, "alpha", RMQ_TEST_ALLOW_EXIT="1", **CHILD)
        try:
            wait_for(
                lambda p=proc: p.popen.poll() is not None or ParkedMessage.objects.exists(), 60
            )
        finally:
            if proc.popen.poll() is None:
                proc.terminate()
            proc.communicate(timeout=60)
        if ParkedMessage.objects.exists():
            break
    row = ParkedMessage.objects.get()
    assert row.reason == "delivery_limit", row.reason_detail
    assert "given back 3 times" in row.reason_detail
    assert [s["attempt"] for s in _alpha(rmq, "start", "killer")] == [1, 2, 3]
    assert wait_for(lambda: rmq.depth(rmq.queue("alpha")) == 0, 30)
