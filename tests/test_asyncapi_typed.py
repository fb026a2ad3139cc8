"""The AsyncAPI document carries each typed topic's JSON Schema (and a receiver's own), as a
valid AsyncAPI 3.0 document whose references all resolve inside it."""

from __future__ import annotations

import dataclasses
import decimal
import io
import json
from typing import Any

import msgspec
import pydantic
from django.core.management import call_command

from django_rmq_retry import Topic, receiver
from tests.test_asyncapi import schema  # noqa: F401  (the fixture: AsyncAPI 3.0's own schema)


class Line(msgspec.Struct):
    sku: str


class Paid(msgspec.Struct):
    order_id: int
    amount: decimal.Decimal
    lines: list[Line] = []


class Line2(pydantic.BaseModel):  # another "line", pydantic's, under another name
    sku: str
    qty: int


class Shipped(pydantic.BaseModel):
    order_id: int
    lines: list[Line2]


@dataclasses.dataclass
class Audit:
    order_id: int
    note: str = ""


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def test_typed_topics_and_receivers_carry_their_json_schema(registry_snapshot, schema):  # noqa: F811
    import jsonschema

    paid = Topic("typed.doc.paid", schema=Paid, schema_version=2)
    shipped = Topic("typed.doc.shipped", schema=Shipped)
    plain = Topic("typed.doc.plain")

    @receiver(paid)
    def bill(message, **kwargs):
        pass

    @receiver(shipped)
    def ship(message, **kwargs):
        pass

    @receiver(plain, schema=Audit)
    def audit(message, **kwargs):
        pass

    out = io.StringIO()
    call_command("rmq_asyncapi", stdout=out)
    doc = json.loads(out.getvalue())
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)] == []
    for ref in _refs(doc):
        _resolve(doc, ref)  # every reference resolves inside the document

    messages = doc["components"]["messages"]
    paid_message = _resolve(
        doc, doc["channels"]["topic_typed_doc_paid"]["messages"]["message"]["$ref"]
    )
    payload = _resolve(doc, paid_message["payload"]["$ref"])
    assert set(payload["required"]) == {"order_id", "amount"}
    assert paid_message["headers"]["properties"]["schema_version"]["const"] == 2
    shipped_payload = messages["topic_typed_doc_shipped"]["payload"]
    assert shipped_payload["properties"]["lines"]["items"]["$ref"] == "#/components/schemas/Line2"
    audit_ref = doc["channels"][
        next(k for k in doc["channels"] if k.startswith("queue_") and k.endswith("audit"))
    ]["messages"]["message"]["$ref"]
    audit_payload = _resolve(doc, audit_ref)["payload"]
    assert _resolve(doc, audit_payload["$ref"])["required"] == ["order_id"]
    assert doc["channels"]["topic_typed_doc_plain"]["messages"]["message"]["$ref"] == (
        "#/components/messages/message"
    )
