"""Typed receivers, the consuming side, on the in-memory broker: the receiver gets an
instance; a body that does not fit is parked at its first delivery as *invalid* with its
failing fields, never retried, the receiver never run; older versions are upcast first."""

from __future__ import annotations

import dataclasses
import decimal
import json

import msgspec
import pydantic
import pytest

from django_rmq_retry import Topic, receiver, upcaster
from django_rmq_retry.core.names import Names
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.schemas.upcasting import forget
from django_rmq_retry.testing import InMemoryBroker

pytestmark = pytest.mark.django_db


class MOrder(msgspec.Struct):
    order_id: int
    amount: decimal.Decimal


class POrder(pydantic.BaseModel):
    order_id: int
    amount: decimal.Decimal


@dataclasses.dataclass
class DOrder:
    order_id: int
    amount: decimal.Decimal


INVALID = [
    (b'{"amount": "1.00"}', ["order_id"]),  # a field missing
    (b'{"order_id": "x", "amount": "1.00"}', ["order_id"]),  # a field of the wrong type
    (b"[1, 2]", []),  # a list for an object
    (b"{not json", []),  # not JSON at all
]


def publish_raw(broker: InMemoryBroker, routing_key: str, body: bytes, **headers) -> None:
    """As a foreign client would: straight onto the work exchange, nothing validated."""
    props = {"content_type": "application/json", "delivery_mode": 2, "headers": headers}
    broker.model.publish(Names(broker.names.prefix).work_exchange, routing_key, body, props)


@pytest.mark.parametrize("schema", [MOrder, POrder, DOrder])
def test_valid_bodies_run_typed_and_invalid_ones_park_at_once(registry_snapshot, schema):
    topic = Topic(f"typed.recv.{schema.__name__.lower()}", schema=schema)
    seen = []

    @receiver(topic, retry={"max_attempts": 5})
    def typed_receiver(message, **kwargs):
        seen.append(message.data)

    with InMemoryBroker() as broker:
        topic.send({"order_id": 1, "amount": "9.99"})
        for body, _loc in INVALID:
            publish_raw(broker, topic.routing_key, body)
        runs = broker.run_until_idle()
    assert seen == [schema(order_id=1, amount=decimal.Decimal("9.99"))]
    assert sorted(r.outcome for r in runs) == ["handled"] + ["parked"] * 4
    rows = list(ParkedMessage.objects.order_by("id"))
    assert [r.reason for r in rows] == ["invalid"] * 4
    assert [r.attempts for r in rows] == [1] * 4
    for row, (body, loc) in zip(rows, INVALID, strict=True):
        assert bytes(row.body) == body
        assert loc in [e["loc"] for e in row.field_errors]
        assert schema.__name__ in row.reason_detail


def test_a_receiver_schema_wins_over_an_untyped_topic(registry_snapshot):
    topic = Topic("typed.recv.own")
    seen = []

    @receiver(topic, schema=DOrder)
    def own_schema(message, **kwargs):
        seen.append((message.data, message.body))

    with InMemoryBroker() as broker:
        topic.send({"order_id": 2, "amount": "1.5"})  # the topic does not validate
        topic.send({"order_id": "two"})
        broker.run_until_idle()
    assert seen == [(DOrder(2, decimal.Decimal("1.5")), {"order_id": 2, "amount": "1.5"})]
    row = ParkedMessage.objects.get()
    assert row.reason == "invalid"
    assert sorted(json.dumps(e["loc"]) for e in row.field_errors) == ['["amount"]', '["order_id"]']


def test_an_upcaster_turns_a_v1_body_into_v2_before_validation(registry_snapshot):
    class V2(msgspec.Struct):
        order_id: int
        amount: decimal.Decimal

    topic = Topic("typed.recv.versions", schema=V2, schema_version=2)

    @upcaster(topic, 1, 2)
    def cents_to_amount(body):
        return {"order_id": body["order_id"], "amount": str(decimal.Decimal(body["cents"]) / 100)}

    seen = []

    @receiver(topic)
    def versioned(message, **kwargs):
        seen.append(message.data)

    try:
        with InMemoryBroker() as broker:
            publish_raw(
                broker, topic.routing_key, b'{"order_id": 3, "cents": 1250}'
            )  # no header: v1
            publish_raw(broker, topic.routing_key, b'{"order_id": 4, "cents": 1}', schema_version=1)
            topic.send({"order_id": 5, "amount": "0.10"})  # v2, as the topic sends it
            publish_raw(broker, topic.routing_key, b'{"order_id": 6}', schema_version=3)
            broker.run_until_idle()
    finally:
        forget(topic)
    assert sorted((d.order_id, d.amount) for d in seen) == [
        (3, decimal.Decimal("12.50")),
        (4, decimal.Decimal("0.01")),
        (5, decimal.Decimal("0.10")),
    ]
    row = ParkedMessage.objects.get()  # a newer version than this consumer knows
    assert row.reason == "invalid" and "newer" in row.field_errors[0]["msg"]
