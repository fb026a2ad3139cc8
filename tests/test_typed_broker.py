"""Typed receivers end to end on the real broker, for msgspec, pydantic and a dataclass:
a foreign client (raw pika) publishes 10 valid and 5 invalid bodies; the receiver runs 10
times with typed instances and the 5 are parked at attempt 1, reason *invalid*, their
failing fields named; ``send`` of an invalid dict raises and publishes nothing; an
upcaster turns a version 1 body into version 2."""

from __future__ import annotations

import dataclasses
import decimal
import json

import msgspec
import pika
import pydantic
import pytest
from django.core.management import call_command

from django_rmq_retry import Topic, ValidationError, receiver, upcaster
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.schemas.upcasting import forget

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


class MItem(msgspec.Struct):
    sku: str


class MOrder(msgspec.Struct):
    order_id: int
    amount: decimal.Decimal
    items: list[MItem] = []


class PItem(pydantic.BaseModel):
    sku: str


class POrder(pydantic.BaseModel):
    order_id: int
    amount: decimal.Decimal
    items: list[PItem] = []


@dataclasses.dataclass
class DItem:
    sku: str


@dataclasses.dataclass
class DOrder:
    order_id: int
    amount: decimal.Decimal
    items: list[DItem] = dataclasses.field(default_factory=list)


#: The five invalid bodies and the field each parked row must name.
INVALID = [
    (b'{"amount": "1.00"}', ["order_id"]),  # a field missing
    (b'{"order_id": "x", "amount": "1.00"}', ["order_id"]),  # the wrong type
    (b"{not json", []),  # not JSON
    (b'[{"order_id": 1}]', []),  # a list
    (b'{"order_id": 1, "amount": "1", "items": [{"sku": 7}]}', ["items", 0, "sku"]),
]


def publish_foreign(rmq, routing_key: str, bodies: list[bytes], **headers) -> None:
    """A client that is not ours: plain pika, JSON content type, nothing validated."""
    channel = rmq.ch()
    for body in bodies:
        channel.basic_publish(
            rmq.names.work_exchange,
            routing_key,
            body,
            pika.BasicProperties(
                content_type="application/json", delivery_mode=2, headers=headers or None
            ),
        )


@pytest.mark.parametrize("schema", [MOrder, POrder, DOrder])
def test_a_foreign_client_s_valid_bodies_run_typed_and_invalid_ones_park_at_once(
    rmq, registry_snapshot, schema
):
    topic = Topic(f"typed.broker.{schema.__name__.lower()}", schema=schema)
    seen: list[tuple[object, int]] = []

    @receiver(topic, retry={"max_attempts": 5, "initial_delay": 0.1})
    def typed_orders(message, **kwargs):
        seen.append((message.data, message.attempt))

    rmq.setup()
    valid = [
        json.dumps({"order_id": i, "amount": f"{i}.05", "items": [{"sku": f"S{i}"}]}).encode()
        for i in range(10)
    ]
    publish_foreign(rmq, topic.routing_key, valid + [body for body, _ in INVALID])
    call_command("rmq_consume", "typed_orders", max_messages=15, max_idle_time=60, verbosity=0)

    assert len(seen) == 10 and {attempt for _, attempt in seen} == {1}
    assert all(isinstance(data, schema) for data, _ in seen)
    assert sorted((d.order_id, d.amount) for d, _ in seen) == [
        (i, decimal.Decimal(f"{i}.05")) for i in range(10)
    ]
    rows = {bytes(r.body): r for r in ParkedMessage.objects.all()}
    assert sorted(rows) == sorted(body for body, _ in INVALID)
    for body, loc in INVALID:
        row = rows[body]
        assert (row.reason, row.attempts) == ("invalid", 1)
        assert loc in [e["loc"] for e in row.field_errors], row.field_errors
    queue = rmq.queue("typed_orders")
    assert rmq.depth(queue) == 0

    with pytest.raises(ValidationError) as caught:
        topic.send({"order_id": "not a number", "amount": "1"})
    assert [e["loc"] for e in caught.value.errors] == [["order_id"]]
    assert rmq.depth(queue) == 0  # nothing was published
    topic.send(schema(order_id=99, amount=decimal.Decimal("0.10")))  # an instance goes out
    assert rmq.depth(queue) == 1


def test_an_upcaster_turns_a_foreign_v1_body_into_v2(rmq, registry_snapshot):
    class OrderV2(msgspec.Struct):
        order_id: int
        amount: decimal.Decimal

    topic = Topic("typed.broker.versions", schema=OrderV2, schema_version=2)

    @upcaster(topic, 1, 2)
    def cents_to_amount(body):
        return {"order_id": body["order_id"], "amount": str(decimal.Decimal(body["cents"]) / 100)}

    seen: list[OrderV2] = []

    @receiver(topic)
    def versioned_orders(message, **kwargs):
        seen.append(message.data)

    rmq.setup()
    try:
        publish_foreign(rmq, topic.routing_key, [b'{"order_id": 1, "cents": 1999}'])  # v1
        topic.send({"order_id": 2, "amount": "5.00"})  # v2
        call_command(
            "rmq_consume", "versioned_orders", max_messages=2, max_idle_time=60, verbosity=0
        )
    finally:
        forget(topic)
    assert sorted((d.order_id, d.amount) for d in seen) == [
        (1, decimal.Decimal("19.99")),
        (2, decimal.Decimal("5.00")),
    ]
    assert ParkedMessage.objects.count() == 0
