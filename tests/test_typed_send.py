"""Typed topics, the sending side: one adapter protocol for msgspec, pydantic v2 and
dataclasses; ``send`` validates before anything is published and encodes instances with
their library, ``Decimal`` and datetimes exact."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import subprocess
import sys

import msgspec
import pydantic
import pytest
from django.core.exceptions import ImproperlyConfigured

from django_rmq_retry import Topic, ValidationError, upcaster
from django_rmq_retry.schemas import adapter_for
from django_rmq_retry.schemas.upcasting import forget, upcast, version_of
from django_rmq_retry.testing import InMemoryBroker


class MItem(msgspec.Struct):
    sku: str


class MOrder(msgspec.Struct):
    order_id: int
    amount: decimal.Decimal
    paid_at: dt.datetime | None = None
    items: list[MItem] = []


class PItem(pydantic.BaseModel):
    sku: str


class POrder(pydantic.BaseModel):
    order_id: int
    amount: decimal.Decimal
    paid_at: dt.datetime | None = None
    items: list[PItem] = []


@dataclasses.dataclass
class DItem:
    sku: str


@dataclasses.dataclass
class DOrder:
    order_id: int
    amount: decimal.Decimal
    paid_at: dt.datetime | None = None
    items: list[DItem] = dataclasses.field(default_factory=list)


SCHEMAS = [MOrder, POrder, DOrder]
PAID = dt.datetime(2026, 11, 28, 9, 30, 1, 123456, tzinfo=dt.timezone.utc)
GOOD = {"order_id": 7, "amount": "12.50", "paid_at": "2026-11-28T09:30:01.123456Z"}


def locs(exc: ValidationError) -> list[list]:
    return [e["loc"] for e in exc.errors]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_valid_body_becomes_an_instance_exactly(schema):
    order = adapter_for(schema).validate({**GOOD, "items": [{"sku": "A-1"}]})
    assert isinstance(order, schema)
    assert order.amount == decimal.Decimal("12.50") and str(order.amount) == "12.50"
    assert order.paid_at == PAID and order.items[0].sku == "A-1"


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"amount": "1"}, ["order_id"]),  # missing
        ({"order_id": "seven", "amount": "1"}, ["order_id"]),  # wrong type
        ({"order_id": 1, "amount": "1", "items": [{"sku": 5}]}, ["items", 0, "sku"]),
        ([1, 2], []),  # a list for an object
    ],
)
def test_an_invalid_body_names_its_failing_field(schema, body, loc):
    with pytest.raises(ValidationError) as caught:
        adapter_for(schema).validate(body)
    assert loc in locs(caught.value)
    assert isinstance(caught.value, ValueError)
    assert all(isinstance(e["msg"], str) and e["msg"] for e in caught.value.errors)


@pytest.mark.parametrize("schema", SCHEMAS)
def test_an_instance_is_encoded_by_its_library_decimal_and_datetime_exact(schema):
    adapter = adapter_for(schema)
    instance = adapter.validate(GOOD)
    data = json.loads(adapter.encode(instance))
    assert data["amount"] == "12.50"
    assert dt.datetime.fromisoformat(data["paid_at"].replace("Z", "+00:00")) == PAID
    assert adapter.validate(data) == instance  # and back, unchanged


@pytest.mark.parametrize("schema", [MOrder, DOrder])  # pydantic's lax mode takes True as 1
def test_a_bool_is_no_int(schema):
    with pytest.raises(ValidationError) as caught:
        adapter_for(schema).validate({"order_id": True, "amount": "1"})
    assert locs(caught.value) == [["order_id"]]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_each_schema_has_a_json_schema_naming_its_required_fields(schema):
    doc = adapter_for(schema).json_schema()
    text = json.dumps(doc)
    assert "order_id" in text and "amount" in text and "required" in text


@pytest.mark.django_db
@pytest.mark.parametrize("schema", SCHEMAS)
def test_send_validates_before_publishing_and_stamps_the_version(schema):
    topic = Topic(f"typed.send.{schema.__name__.lower()}", schema=schema, schema_version=3)
    with InMemoryBroker() as broker:
        with pytest.raises(ValidationError) as caught:
            topic.send({"order_id": "x", "amount": "1"})
        assert locs(caught.value) == [["order_id"]]
        with pytest.raises(ValidationError):
            topic.send(b"not json")
        with pytest.raises(ValidationError):  # one bad body: none of the batch goes out
            topic.send_many([GOOD, {"amount": "1"}])
        assert broker.sent == []
        adapter = adapter_for(schema)
        for body in (GOOD, adapter.validate(GOOD), json.dumps(GOOD).encode()):
            try:
                topic.send(body)
            except Exception as exc:  # unroutable: nothing is bound to this key
                assert not isinstance(exc, ValidationError)
        assert len(broker.sent) == 3
        for sent in broker.sent:
            assert sent.properties["headers"]["schema_version"] == 3
            assert sent.properties["content_type"] == "application/json"
            assert adapter.validate(json.loads(sent.raw)) == adapter.validate(GOOD)


def test_a_topic_refuses_what_is_no_schema():
    with pytest.raises(ImproperlyConfigured, match=r"msgspec\.Struct"):
        Topic("typed.bad", schema=dict)
    with pytest.raises(ImproperlyConfigured, match="schema_version"):
        Topic("typed.bad", schema=MOrder, schema_version=0)


def test_upcasters_chain_versions_and_refuse_what_they_cannot_reach():
    topic = Topic("typed.versions", schema=MOrder, schema_version=3)

    @upcaster(topic, 1, 2)
    def one_to_two(body):
        cents = body.pop("cents")
        return {**body, "amount": str(cents / 100)}

    @upcaster(topic, 2, 3)
    def two_to_three(body):
        return {**body, "order_id": int(body["order_id"])}

    try:
        assert upcast(topic.routing_key, 1, 3, {"order_id": "4", "cents": 1250}) == {
            "order_id": 4,
            "amount": "12.5",
        }
        with pytest.raises(ValidationError, match="newer"):
            upcast(topic.routing_key, 4, 3, {})
        with pytest.raises(ValidationError, match="failed"):
            upcast(topic.routing_key, 1, 3, {"order_id": 1})  # no "cents"
        assert version_of({}) == 1 and version_of({"schema_version": "2"}) == 2
        with pytest.raises(ValidationError):
            version_of({"schema_version": "two"})
    finally:
        forget(topic)


def test_nothing_imports_msgspec_or_pydantic_unless_a_schema_uses_them():
    code = (
        "import os, sys, dataclasses, django;"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.settings'; django.setup();"
        "from django_rmq_retry import Topic;"
        "import django_rmq_retry.consumer.handler, django_rmq_retry.consumer.schema_gate;"
        "D = dataclasses.make_dataclass('D', [('a', int)]);"
        "Topic('typed.plain', schema=D).send.__name__;"
        "print(sorted(m for m in ('msgspec', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_a_schema_whose_type_hints_do_not_resolve_fails_at_declaration():
    """Not at its first message: a consumer would otherwise give it back again and again."""

    def declare():
        class Inner(msgspec.Struct):
            x: int

        class Outer(msgspec.Struct):
            inner: Inner  # a string under `from __future__ import annotations`: unresolvable

        return Outer

    with pytest.raises(ImproperlyConfigured, match="do not resolve"):
        Topic("typed.unresolved", schema=declare())


@pytest.mark.django_db
def test_a_typed_send_through_the_outbox_is_validated_and_relayed_encoded(registry_snapshot):
    from django_rmq_retry import receiver

    topic = Topic("typed.send.outbox", schema=MOrder, outbox=True)
    seen = []

    @receiver(topic)
    def outboxed(message, **kwargs):
        seen.append((message.data, message.headers.get("schema_version")))

    with InMemoryBroker() as broker:
        with pytest.raises(ValidationError):
            topic.send({"order_id": 1})
        topic.send(MOrder(order_id=1, amount=decimal.Decimal("2.50")))
        topic.send_on_commit({"order_id": 2, "amount": "3.75"})
        with pytest.raises(ValidationError):
            topic.send_on_commit({"amount": "1"})
        broker.run_until_idle()
    assert sorted((d.order_id, d.amount, v) for d, v in seen) == [
        (1, decimal.Decimal("2.50"), 1),
        (2, decimal.Decimal("3.75"), 1),
    ]
