"""The contract for what decides before a receiver runs (``consumer.gates``): a typed
receiver's invalid bodies, a gate's give-back and a gate's hold end the same on RabbitMQ and
in the in-memory broker (``test_contract.run_both``: each scenario on both, outcomes equal
and equal to what the scenario states)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from django_rmq_retry import Topic, receiver
from django_rmq_retry.consumer import gates as gates_module
from django_rmq_retry.consumer.gates import Arrival, GateContext
from django_rmq_retry.core.gate_outcome import GateOutcome, GiveBack, Hold
from django_rmq_retry.models import ParkedMessage
from tests.contract.test_contract import run_both, starts
from tests.testapp.consumers import behave

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


class Order(msgspec.Struct):
    id: str
    order_id: int
    fail: int = 0


typed = Topic("contract.typed", schema=Order)
untyped = Topic("contract.typed")  # the same key, not validated: a producer that is not ours


class BackThenHeld:
    """Gives message "g1" back once, then holds it once (0.3 s); says nothing otherwise."""

    seen: dict[Any, int] = {}

    def __init__(self, context: GateContext) -> None:
        self.context = context

    def check(self, arrival: Arrival) -> GateOutcome | None:
        key = arrival.delivery.properties.get("message_id")
        if key != "g1":
            return None
        BackThenHeld.seen[key] = BackThenHeld.seen.get(key, 0) + 1
        if BackThenHeld.seen[key] == 1:
            return GiveBack("once", wait=0.2)
        if BackThenHeld.seen[key] == 2:
            return Hold(0.3, "once")
        return None


def test_typed_bodies_gives_back_and_holds_agree(rmq, registry_snapshot, monkeypatch):
    monkeypatch.setattr(gates_module, "GATES", [*gates_module.GATES, f"{__name__}.BackThenHeld"])

    @receiver(typed, retry={"max_attempts": 3, "initial_delay": 0.2, "jitter": "none"})
    def typed_contract(message, **kwargs):
        assert isinstance(message.data, Order)
        behave("typed_contract", message)

    rmq.setup()

    def scenario(h):
        BackThenHeld.seen = {}
        typed.send({"id": "v1", "order_id": 1}, message_id="v1")
        typed.send({"id": "v2", "order_id": 2, "fail": 1}, message_id="v2")  # one retry
        typed.send({"id": "g1", "order_id": 3}, message_id="g1")  # given back, then held
        untyped.send({"id": "i1"}, message_id="i1")  # order_id missing
        untyped.send({"id": "i2", "order_id": "two"}, message_id="i2")  # the wrong type
        untyped.send(b"{not json", content_type="application/json", message_id="i3")
        h.consume()

    real, _ = run_both(rmq, scenario)
    assert real["starts"] == starts(
        ("typed_contract", "v1", 1),
        ("typed_contract", "v2", 1),
        ("typed_contract", "v2", 2),
        ("typed_contract", "g1", 1),
    )
    assert real["parked"] == [
        ("typed_contract", key, "invalid", 1, "parked", 1, 0) for key in ("i1", "i2", "i3")
    ]
    rows = {r.message_id: r for r in ParkedMessage.objects.all()}  # the in-memory run's
    assert [e["loc"] for e in rows["i1"].field_errors] == [["order_id"]]
    assert [e["loc"] for e in rows["i2"].field_errors] == [["order_id"]]
    assert rows["i3"].field_errors[0]["loc"] == []
