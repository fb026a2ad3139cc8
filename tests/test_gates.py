"""The gates between a delivery and its receiver (``consumer.gates``).

First on plain data (no broker, no database): each outcome a gate may give becomes the
action the consumer carries out. Then the in-memory broker honouring them on its virtual
clock, with a gate registered the way a module of ours registers one (``GATES``).
"""

from __future__ import annotations

import random
from datetime import datetime, timezone
from typing import Any

import pytest

from django_rmq_retry import Topic, receiver
from django_rmq_retry.consumer import gates as gates_module
from django_rmq_retry.consumer.actions import Ack, Delivery, PublishHold, Release, StorePark
from django_rmq_retry.consumer.gates import Arrival, GateContext
from django_rmq_retry.consumer.handler import Handler
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.gate_outcome import (
    MIN_GIVE_BACK_WAIT,
    GateOutcome,
    GiveBack,
    Hold,
    Proceed,
)
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.outcome import Park, ParkReason
from django_rmq_retry.registry import Receiver, Registry, TopicKey
from django_rmq_retry.testing import InMemoryBroker

NAMES = Names("p")
LEVELS = DelayLevels(100, 23)
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
NOW_MS = int(NOW.timestamp() * 1000)


class Said:
    """A gate that answers what it is told, and remembers what it saw."""

    def __init__(self, *answers: GateOutcome | None) -> None:
        self.answers = list(answers)
        self.seen: list[Arrival] = []

    def check(self, arrival: Arrival) -> GateOutcome | None:
        self.seen.append(arrival)
        return self.answers.pop(0) if self.answers else None


class Limits:
    """The delivery-limit bookkeeping without the database: every delivery counted."""

    def applies(self, d: Delivery, headers: Any) -> bool:
        return True

    def check(self, d: Delivery, headers: Any) -> tuple[str | None, Park | None]:
        return "start-key", None


def make(*gates: Any) -> tuple[Handler, Receiver, list[Any]]:
    calls: list[Any] = []

    def invoice(message: Any, **kwargs: Any) -> None:
        calls.append(message)

    rec = Registry().register(invoice, [TopicKey("shop.order.paid")])
    handler = Handler(
        NAMES, LEVELS, limits=Limits(), clock=lambda: NOW, rng=random.Random(0), gates=gates
    )
    return handler, rec, calls


def delivery(rec: Receiver, headers: dict[str, Any] | None = None) -> Delivery:
    props = {"content_type": "application/json", "message_id": "m-1", "headers": headers or {}}
    return Delivery(
        rec.queue_name("p"), rec, "p.work", "shop.order.paid", False, props, b'{"order_id": 42}'
    )


def test_gates_run_in_order_and_proceed_hands_the_receiver_its_data():
    first, second = Said(Proceed("typed")), Said(None)
    handler, rec, calls = make(first, second)
    assert handler.handle(delivery(rec)) == Ack(start_key="start-key")
    assert calls[0].data == "typed" and calls[0].body == {"order_id": 42}
    assert first.seen[0].body == {"order_id": 42} and first.seen[0].receiver is rec
    assert second.seen[0].data == "typed"  # a later gate sees what an earlier one made


def test_without_a_gate_saying_anything_the_data_is_the_body():
    handler, rec, calls = make(Said(None))
    handler.handle(delivery(rec))
    assert calls[0].data == {"order_id": 42}


def test_a_park_stops_the_pipeline_and_parks_at_this_attempt_without_running():
    later = Said(None)
    handler, rec, calls = make(Said(Park(ParkReason.REJECTED, "no schema fits")), later)
    action = handler.handle(delivery(rec))
    assert isinstance(action, StorePark) and not calls and not later.seen
    assert action.request.reason == "rejected" and action.request.attempts == 1
    assert action.request.reason_detail == "no schema fits"
    assert action.start_key == "start-key"


def test_a_hold_is_a_copy_through_the_delay_levels_with_the_same_attempt():
    handler, rec, calls = make(Said(Hold(1.0, "key k is held")))
    retried = {"p-attempt": 3, "p-original-exchange": "p.work"}
    d = delivery(rec, {**retried, "p-original-routing-key": "shop.order.paid"})
    d = Delivery(d.queue, rec, "p.deliver", d.queue, False, d.properties, d.body)
    action = handler.handle(d)
    assert isinstance(action, PublishHold) and not calls
    assert action.exchange == "p.delay.03"  # 1 s: levels 3 and 1, as a retry's
    headers = action.properties["headers"]
    assert headers["p-attempt"] == 3  # nothing counted
    assert headers["p-due"] == NOW_MS + 1000 and headers["p-target"] == rec.queue_name("p")
    assert headers["p-original-routing-key"] == "shop.order.paid"
    assert "p-error" not in headers and "p-first-failure" not in headers  # nothing failed
    assert action.start_key == "start-key" and "key k is held" in action.log_line


def test_a_give_back_is_uncounted_and_waits():
    handler, rec, calls = make(Said(GiveBack("breaker open", wait=2.0)))
    action = handler.handle(delivery(rec))
    assert action == Release(cause="breaker open", counted=False, wait=2.0, start_key="start-key")
    assert not calls


def test_outcomes_refuse_a_wait_that_would_loop():
    assert GiveBack("x", wait=0).wait == MIN_GIVE_BACK_WAIT
    assert GiveBack("x", wait=float("nan")).wait == MIN_GIVE_BACK_WAIT
    assert Hold(-1, "x").delay > 0


def test_the_default_pipeline_is_built_from_GATES(monkeypatch):
    monkeypatch.setattr(gates_module, "GATES", [f"{__name__}.OnlyEven"])
    handler = Handler(NAMES, LEVELS, limits=None)
    assert [type(g).__name__ for g in handler.gates.gates] == ["OnlyEven"]


# The in-memory broker honours them ---------------------------------------------------------
class OnlyEven:
    """Registered through ``GATES``: holds odd orders once, gives back order 7 twice."""

    given_back: dict[int, int] = {}

    def __init__(self, context: GateContext) -> None:
        self.context = context

    def check(self, arrival: Arrival) -> GateOutcome | None:
        order = arrival.body["order_id"]
        if order == 7 and OnlyEven.given_back.get(order, 0) < 2:
            OnlyEven.given_back[order] = OnlyEven.given_back.get(order, 0) + 1
            return GiveBack("seven waits", wait=5)
        if order % 2 and arrival.envelope.attempt == 1 and not arrival.envelope.via_us:
            return Hold(30, "odd orders wait")
        if order < 0:
            return Park(ParkReason.REJECTED, "negative order")
        return Proceed({"typed": order})


gated = Topic("gates.order.paid")


@pytest.mark.django_db
def test_the_in_memory_broker_carries_out_every_outcome(registry_snapshot, monkeypatch):
    monkeypatch.setattr(gates_module, "GATES", [f"{__name__}.OnlyEven"])
    OnlyEven.given_back = {}
    seen: list[Any] = []

    @receiver(gated)
    def typed_orders(message, **kwargs):
        seen.append((message.data, message.attempt))

    with InMemoryBroker() as broker:
        for order in (2, 3, 7, -2):
            gated.send({"order_id": order})
        runs = broker.run_until_idle()
    outcomes = [(r.outcome, r.attempt) for r in runs]
    assert outcomes.count(("held", 1)) == 2  # 3 and 7, once each
    assert outcomes.count(("given_back", 1)) == 2  # 7, twice
    assert outcomes.count(("parked", 1)) == 1  # -2
    assert sorted(seen, key=lambda s: s[0]["typed"]) == [
        ({"typed": 2}, 1),
        ({"typed": 3}, 1),  # held, yet still its first attempt
        ({"typed": 7}, 1),
    ]
    assert broker.elapsed >= 30  # the holds waited in the delay levels, on the virtual clock
