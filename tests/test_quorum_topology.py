"""The quorum queues' broker-side delivery limit, on plain data (issue #12).

RabbitMQ 4.0 gives quorum queues a default delivery limit of 20 and *drops* a message past it
when no dead-letter exchange is set; ``-1`` means "no limit" on 4.0 but drops after the first
return on 3.10 (``/work/shared/BROKER_FACTS.md``). So every quorum queue a consumer reads gets
an explicit, positive limit, and every one but ``p.dead`` dead-letters into ``p.dead``, which
the consumer parks. The broker end of the story is ``tests/faults/test_quorum_limits.py``.
"""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from django_rmq_retry.consumer.actions import Delivery, StorePark
from django_rmq_retry.consumer.handler import Handler
from django_rmq_retry.core.backoff import Policy
from django_rmq_retry.core.deadletter import last_death
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.topology_plan import (
    DEAD_QUEUE_DELIVERY_LIMIT,
    QUORUM_DELIVERY_LIMIT,
    plan,
)

NAMES = Names("p")
LEVELS = DelayLevels(100, 4)


class Owner:
    name = "shop.consumers.invoice"
    routing_keys = ["shop.order.paid"]

    def queue_name(self, prefix: str) -> str:
        return f"{prefix}.{self.name}"


def _queues(queue_type: str) -> dict[str, dict]:
    return {q.name: q.arguments for q in plan([Owner()], NAMES, LEVELS, queue_type).queues}


def test_quorum_receiver_and_orphan_queues_dead_letter_past_an_explicit_limit():
    queues = _queues("quorum")
    for name in ("p.shop.consumers.invoice", "p.orphans"):
        args = queues[name]
        assert args["x-delivery-limit"] == QUORUM_DELIVERY_LIMIT > 20, name
        assert args["x-dead-letter-exchange"] == "p.dead"
        # at-least-once: the message leaves its queue only once p.dead confirmed it
        assert args["x-dead-letter-strategy"] == "at-least-once"
        assert args["x-overflow"] == "reject-publish"


def test_the_dead_queue_has_a_far_limit_and_nowhere_further_to_go():
    the_plan = plan([Owner()], NAMES, LEVELS, "quorum")
    dead = {q.name: q for q in the_plan.queues}["p.dead"]
    assert dead.arguments == {
        "x-queue-type": "quorum",
        "x-delivery-limit": DEAD_QUEUE_DELIVERY_LIMIT,
    }
    assert ("p.dead", "fanout", {}) in the_plan.exchanges
    assert [b.source for b in dead.bindings] == ["p.dead"]
    assert the_plan.parking_queues == ["p.dead", "p.orphans"]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_every_delivery_limit_is_explicit_positive_and_below_2_to_the_31(queue_type):
    # -1 drops after one return on 3.10; 2^32 did too; no value at all means 20 on 4.0.
    for name, args in _queues(queue_type).items():
        if args.get("x-queue-type") == "quorum" and not name.startswith("p.delay."):
            assert 0 < args["x-delivery-limit"] < 2**31, name


def test_classic_queues_are_unchanged():
    the_plan = plan([Owner()], NAMES, LEVELS, "classic")
    queues = {q.name: q.arguments for q in the_plan.queues}
    assert "p.dead" not in queues
    assert queues["p.shop.consumers.invoice"] == {} and queues["p.orphans"] == {}
    assert the_plan.parking_queues == ["p.orphans"]


def _death(queue: str, reason: str = "delivery_limit", exchange: str = "p.work") -> dict:
    return {
        "count": 1,
        "reason": reason,
        "queue": queue,
        "time": datetime(2026, 11, 23, tzinfo=timezone.utc),
        "exchange": exchange,
        "routing-keys": ["shop.order.paid"],
    }


def _handle(headers: dict) -> StorePark:
    handler = Handler(
        NAMES,
        LEVELS,
        limits=None,
        policy_for=lambda rec: Policy(),
        clock=lambda: datetime(2026, 11, 23, 12, tzinfo=timezone.utc),
        rng=random.Random(0),
    )
    d = Delivery(
        queue="p.dead",
        receiver=None,
        exchange="p.dead",
        routing_key="shop.order.paid",
        redelivered=False,
        properties={"message_id": "m-1", "content_type": "application/json", "headers": headers},
        body=b'{"id": 1}',
    )
    action = handler.handle(d)
    assert isinstance(action, StorePark)
    return action


def test_a_dead_lettered_message_is_parked_under_the_queue_it_left():
    req = _handle(
        {"x-death": [_death("p.shop.consumers.invoice")], "x-delivery-count": 1000}
    ).request
    assert (req.reason, req.receiver, req.queue) == (
        "delivery_limit",
        "shop.consumers.invoice",
        "p.shop.consumers.invoice",
    )
    assert (req.exchange, req.routing_key) == ("p.work", "shop.order.paid")
    assert "delivery limit (1000)" in req.reason_detail
    assert "'p.shop.consumers.invoice'" in req.reason_detail


def test_a_retry_copy_keeps_its_original_route_and_attempt():
    # it entered the receiver queue from our deliver exchange, as the broker recorded
    headers = {
        "x-death": [_death("p.shop.consumers.invoice", exchange="p.deliver")],
        "p-attempt": 3,
        "p-original-exchange": "p.work",
        "p-original-routing-key": "shop.order.refunded",
        "p-target": "p.shop.consumers.invoice",
    }
    req = _handle(headers).request
    assert (req.attempts, req.routing_key) == (3, "shop.order.refunded")


def test_our_headers_on_a_message_published_straight_to_the_work_exchange_are_not_trusted():
    headers = {"x-death": [_death("p.shop.consumers.invoice")], "p-attempt": 3}
    req = _handle(headers).request
    assert (req.attempts, req.routing_key) == (1, "shop.order.paid")


def test_an_orphan_that_hit_the_limit_is_parked_under_its_target():
    headers = {"x-death": [_death("p.orphans")], "p-target": "p.shop.consumers.gone"}
    req = _handle(headers).request
    assert (req.queue, req.receiver) == ("p.shop.consumers.gone", "shop.consumers.gone")


@pytest.mark.parametrize(
    ("reason", "words"),
    [("expired", "message-ttl"), ("maxlen", "max-length"), ("rejected", "without requeue")],
)
def test_other_dead_letterings_say_what_the_broker_did(reason, words):
    req = _handle({"x-death": [_death("p.shop.consumers.invoice", reason)]}).request
    assert req.reason == "delivery_limit" and words in req.reason_detail


@pytest.mark.parametrize("x_death", [None, [], "forged", [{"queue": 1}], [{"queue": "q"}]])
def test_an_unreadable_x_death_still_parks(x_death):
    headers = {} if x_death is None else {"x-death": x_death}
    assert last_death(headers) is None
    req = _handle(headers).request
    assert req.reason == "delivery_limit" and "without a readable x-death" in req.reason_detail
