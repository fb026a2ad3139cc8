"""``django_rmq_retry.testing`` as a user meets it: the README's example tests, run as
written (with a receiver of their own), the pytest fixture, Django's ``TestCase`` with the
context manager, and the in-memory AMQP model's routing on its own."""

from __future__ import annotations

import pytest
from django.test import TestCase

from django_rmq_retry import Reject, Topic, receiver, signals
from django_rmq_retry.core.topology_plan import Binding, Plan, QueueSpec
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import dotted_path
from django_rmq_retry.testing import InMemoryBroker
from django_rmq_retry.testing.model import MemoryBroker, topic_matches


class Warehouse:
    def reserve(self, sku: str) -> None:  # the real one calls a remote service
        pass


warehouse = Warehouse()
order_paid = Topic("readme.order.paid")


@pytest.fixture
def reserve_stock(registry_snapshot):
    @receiver(order_paid, retry={"max_attempts": 4, "initial_delay": 60, "jitter": "none"})
    def reserve_stock(message, **kwargs):
        if "sku" not in message.body:
            raise Reject("no sku")
        warehouse.reserve(message.body["sku"])

    return reserve_stock


# The README's two tests, verbatim but for the fixture that declares the receiver -------------
@pytest.mark.django_db
def test_a_flaky_warehouse_is_retried(reserve_stock, rmq_broker, monkeypatch):
    answers = iter([TimeoutError("down"), TimeoutError("down"), None])

    def reserve(sku):
        if (error := next(answers)) is not None:
            raise error

    monkeypatch.setattr(warehouse, "reserve", reserve)
    order_paid.send({"order_id": 42, "sku": "A1"})
    runs = rmq_broker.run_until_idle()
    assert [(r.attempt, r.outcome) for r in runs] == [
        (1, "retried"),
        (2, "retried"),
        (3, "handled"),
    ]
    assert rmq_broker.elapsed == pytest.approx(180)  # 60 s + 120 s of backoff, virtual


@pytest.mark.django_db
def test_an_order_without_sku_is_parked(reserve_stock, rmq_broker):
    order_paid.send({"order_id": 43})
    rmq_broker.run_until_idle()
    row = ParkedMessage.objects.get()
    assert (row.reason, row.attempts) == ("rejected", 1)
    assert rmq_broker.runs_of(reserve_stock)[-1].outcome == "parked"


# More of what a user relies on ---------------------------------------------------------------
@pytest.mark.django_db
def test_exhausted_retries_park_with_the_virtual_failure_times(
    reserve_stock, rmq_broker, monkeypatch
):
    monkeypatch.setattr(warehouse, "reserve", lambda sku: 1 / 0)
    order_paid.send({"order_id": 44, "sku": "B2"}, message_id="m-44")
    runs = rmq_broker.run_until_idle()
    assert [r.outcome for r in runs] == ["retried", "retried", "retried", "parked"]
    assert [r.delay for r in runs[:3]] == [60.0, 120.0, 240.0]
    row = ParkedMessage.objects.get()
    assert (row.reason, row.attempts, row.message_id) == ("exhausted", 4, "m-44")
    assert (row.last_failure_at - row.first_failure_at).total_seconds() == pytest.approx(420)
    assert row.error_type == "ZeroDivisionError"


@pytest.mark.django_db
def test_what_was_sent_is_recorded_decoded(reserve_stock, rmq_broker):
    order_paid.send({"order_id": 45, "sku": "C3"})
    order_paid.send_many([{"order_id": 46, "sku": "D4"}])
    assert rmq_broker.sent_to(order_paid) == [
        {"order_id": 45, "sku": "C3"},
        {"order_id": 46, "sku": "D4"},
    ]
    assert rmq_broker.depth("reserve_stock") == 2
    rmq_broker.run_until_idle()
    assert rmq_broker.depth("reserve_stock") == 0


def test_an_unroutable_send_raises_as_it_would_on_rabbitmq(rmq_broker):
    from django_rmq_retry import UnroutableError

    with pytest.raises(UnroutableError, match="no queue is bound"):
        Topic("nobody.listens").send({"x": 1})


class InDjangoTestCase(TestCase):
    """Django's runner: rows live in the test's transaction, and ``message_parked`` (sent on
    commit) still fires, at the end of the delivery."""

    def test_parking_inside_a_test_transaction_sends_the_signal(self):
        topic = Topic("readme.testcase")
        seen = []

        def boom(message, **kwargs):
            raise Reject("never")

        def on_parked(sender, parked: ParkedMessage, reason: str, **kwargs):
            seen.append((sender, reason))

        topic.connect(boom)
        signals.message_parked.connect(on_parked)
        try:
            with InMemoryBroker() as broker:
                topic.send({"id": 1})
                broker.run_until_idle()
        finally:
            signals.message_parked.disconnect(on_parked)
            topic.disconnect(boom)
        assert ParkedMessage.objects.get().reason == "rejected"
        assert seen == [(dotted_path(boom), "rejected")]


def test_topic_patterns_match_like_rabbitmq():
    assert topic_matches("a.*.c", "a.b.c") and not topic_matches("a.*.c", "a.b.b.c")
    assert topic_matches("a.#", "a") and topic_matches("a.#", "a.b.c")
    assert topic_matches("#.c", "c") and topic_matches("#", "")
    assert not topic_matches("a.b", "a.b.c") and not topic_matches("*", "")


def test_the_model_expires_only_at_the_head_and_dead_letters_with_x_death():
    model = MemoryBroker(start_ms=0)
    model.declare(
        Plan(
            exchanges=[("dlx", "fanout", {}), ("in", "direct", {})],
            exchange_bindings=[],
            queues=[
                QueueSpec(
                    "wait",
                    {"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"},
                    [Binding("in", "k")],
                ),
                QueueSpec("out", {}, [Binding("dlx")]),
            ],
        )
    )
    assert model.publish("in", "k", b"1", {"headers": {}})
    model.advance_to(500)
    assert model.publish("in", "k", b"2", {"headers": {}, "expiration": "100"})
    model.advance_to(1200)  # the head expires at 1000; the second, due at 600, waits behind it
    assert [m.body for m in model.queues["out"].messages] == [b"1", b"2"]
    death = model.queues["out"].messages[0].properties["headers"]["x-death"][0]
    assert (death["queue"], death["reason"], death["count"]) == ("wait", "expired", 1)
    assert not model.publish("in", "other", b"3", {})  # unroutable
