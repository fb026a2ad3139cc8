"""Per-key order, the routing half: partition queues in the plan, the publisher's partition
header, the settings and the checks; then the real broker sending each key to one partition
queue with a single active consumer, in publish order."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_rmq_retry import Topic, receiver
from django_rmq_retry.checks import check_settings
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.message import Message
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.ordering import OrderingKeyError, partition_of
from django_rmq_retry.core.topology_plan import plan, receiver_queues
from django_rmq_retry.registry import Registry, default_registry

NAMES = Names("p")
LEVELS = DelayLevels(100, 4)


def _registry() -> Registry:
    reg = Registry()
    events = Topic("shop.account.changed")

    def ordered(message: Any, **kwargs: Any) -> None: ...

    def plain(message: Any, **kwargs: Any) -> None: ...

    reg.register(ordered, [events], queue="ordered", ordering_key="account_id")
    reg.register(plain, [events], queue="plain")
    return reg


def test_an_ordered_receiver_gets_partition_queues_with_a_single_active_consumer() -> None:
    reg = _registry()
    the_plan = plan(reg.all(), NAMES, LEVELS, "classic", partitions=3)
    queues = {q.name: q for q in the_plan.queues}
    assert "p.ordered" not in queues and "p.plain" in queues
    assert [q for q in queues if q.startswith("p.ordered.")] == [
        "p.ordered.p00",
        "p.ordered.p01",
        "p.ordered.p02",
    ]
    assert ("p.ordered.partitions", "headers", {}) in the_plan.exchanges
    assert ("p.ordered.partitions", "p.work", "shop.account.changed") in the_plan.exchange_bindings
    p1 = queues["p.ordered.p01"]
    assert p1.arguments == {"x-single-active-consumer": True}
    assert p1.receiver == reg.all()[0].name
    by_source = {b.source: b for b in p1.bindings}
    assert by_source["p.ordered.partitions"].arguments == {
        "x-match": "all",
        "p-partition:p.ordered": "1",
    }
    assert by_source["p.deliver"].arguments == {"x-match": "all", "p-target": "p.ordered.p01"}
    assert "x-single-active-consumer" not in queues["p.plain"].arguments


def test_quorum_partition_queues_keep_their_delivery_limit() -> None:
    the_plan = plan(_registry().all(), NAMES, LEVELS, "quorum", partitions=2)
    args = {q.name: q.arguments for q in the_plan.queues}["p.ordered.p00"]
    assert args["x-queue-type"] == "quorum"
    assert args["x-dead-letter-exchange"] == "p.dead"
    assert args["x-single-active-consumer"] is True


def test_receiver_queues_are_what_a_consumer_reads() -> None:
    ordered, plain = _registry().all()
    assert receiver_queues(ordered, "p", 2) == ["p.ordered.p00", "p.ordered.p01"]
    assert receiver_queues(plain, "p", 2) == ["p.plain"]


def _message(body: Any) -> Message:
    return Message(body, b"", {}, "rk", "p.work", "", "", None, None, None, None, 1, False)


def test_ordering_key_is_a_field_or_a_callable_and_bad_ones_are_refused() -> None:
    reg = Registry()
    topic = Topic("a.b")

    def by_field(message: Any, **kwargs: Any) -> None: ...

    def by_call(message: Any, **kwargs: Any) -> None: ...

    def broken(message: Any, **kwargs: Any) -> None: ...

    rec = reg.register(by_field, [topic], ordering_key="order.id")
    assert rec.key_of(_message({"order": {"id": 7}})) == "7"
    rec = reg.register(by_call, [topic], ordering_key=lambda m: m.body["k"].upper())
    assert rec.key_of(_message({"k": "x"})) == "X"
    with pytest.raises(OrderingKeyError, match="raised KeyError"):
        rec.key_of(_message({}))
    for bad in ("", ".", "a..b", 3):
        with pytest.raises(ImproperlyConfigured, match="ordering_key="):
            reg.register(broken, [topic], ordering_key=bad)


@pytest.mark.usefixtures("registry_snapshot")
def test_checks_refuse_settings_that_cannot_keep_order() -> None:
    def ids() -> list[str]:
        return sorted(e.id for e in check_settings() if e.id.endswith(("E030", "E031")))

    @receiver(Topic("check.ordering"), ordering_key="k")
    def kept(message: Any, **kwargs: Any) -> None: ...

    assert ids() == []
    with override_settings(RMQ_RETRY={"ORDERING_PARTITIONS": 0, "ORDERING_ON_PARK": "drop"}):
        assert ids() == ["django_rmq_retry.E030", "django_rmq_retry.E030"]
    with override_settings(RMQ_RETRY={"THREADS": 4}):
        assert ids() == ["django_rmq_retry.E031"]

    @receiver(Topic("check.ordering.async"), ordering_key="k")
    async def overlapping(message: Any, **kwargs: Any) -> None: ...

    assert ids() == ["django_rmq_retry.E031"]


@pytest.mark.django_db(transaction=True)
def test_send_refuses_a_message_without_its_key_before_anything_leaves(
    registry_snapshot: None, rmq: Any
) -> None:
    topic = Topic("shop.ordered.refused")

    @receiver(topic, ordering_key="account_id")
    def apply(message: Any, **kwargs: Any) -> None: ...

    rmq.setup()
    with pytest.raises(OrderingKeyError, match="no field 'account_id'"):
        topic.send({"other": 1})
    with pytest.raises(OrderingKeyError, match="no field 'account_id'"):
        topic.send({"other": 1}, outbox=True)


@pytest.mark.django_db(transaction=True)
def test_the_broker_sends_each_key_to_its_partition_in_publish_order(
    registry_snapshot: None, rmq: Any
) -> None:
    topic = Topic("shop.ordered.routed")

    @receiver(topic, ordering_key="account_id", queue="routed")
    def apply(message: Any, **kwargs: Any) -> None: ...

    @receiver(topic, ordering_key=lambda m: str(m.body["n"] % 2), queue="parity")
    def by_parity(message: Any, **kwargs: Any) -> None: ...

    rmq.setup()
    bodies = [{"account_id": f"acct-{i % 7}", "n": i} for i in range(60)]
    topic.send_many(bodies)
    rec = default_registry.find("routed", rmq.prefix)
    assert rec is not None
    seen: dict[str, list[int]] = defaultdict(list)
    for k, queue in enumerate(receiver_queues(rec, rmq.prefix, 4)):
        assert rmq.consumers(queue) == 0
        for _method, _props, raw in rmq.get_all(queue):
            body = json.loads(raw)
            assert partition_of(body["account_id"], 4) == k
            seen[body["account_id"]].append(body["n"])
    assert sum(map(len, seen.values())) == 60
    for key, ns in seen.items():
        assert ns == [b["n"] for b in bodies if b["account_id"] == key]
    parity = default_registry.find("parity", rmq.prefix)
    assert parity is not None
    got = {
        k: [json.loads(raw)["n"] for _m, _p, raw in rmq.get_all(q)]
        for k, q in enumerate(receiver_queues(parity, rmq.prefix, 4))
    }
    assert got[partition_of("0", 4)] == list(range(0, 60, 2))
    assert got[partition_of("1", 4)] == list(range(1, 60, 2))
