"""The contract: ``django_rmq_retry.testing.InMemoryBroker`` behaves like RabbitMQ.

Each scenario runs twice in one test, first against the real broker with the real consumer
loop, then against the in-memory broker, on a clean database and handling log each time.
Both outcomes (every receiver start by attempt, every finish, every parked row with its
reason, attempts, status and counters) must be identical, and must equal what the scenario
states, so two brokers that agree on a wrong answer still fail.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from django_rmq_retry import parking
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.models import DeliveryStart, InboxEntry, OutboxMessage, ParkedMessage
from django_rmq_retry.registry import default_registry
from django_rmq_retry.testing import InMemoryBroker
from tests.conftest import read_log, wait_for
from tests.testapp.events import other, work

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

Outcome = dict[str, Any]


class Real:
    """The real broker: an in-process ``Consumer`` per consume step."""

    name = "rabbitmq"

    def __init__(self, rmq: Any) -> None:
        self.rmq = rmq

    def consume(self, *receivers: str, max_messages: int | None = None) -> None:
        chosen = [default_registry.find(r, self.rmq.prefix) for r in receivers]
        Consumer(
            chosen or default_registry.all(),  # type: ignore[arg-type]
            max_messages=max_messages,
            max_idle_time=None if max_messages else 2.0,
        ).run()

    def delete_queue(self, receiver: str) -> None:
        self.rmq.ch().queue_delete(self.rmq.queue(receiver))

    def wait_orphaned(self, count: int) -> None:
        assert wait_for(lambda: self.rmq.depth(self.rmq.names.orphan_queue) == count, 60)

    def close(self) -> None:
        pass


class Memory:
    """The in-memory broker: one ``InMemoryBroker`` for the whole scenario."""

    name = "in-memory"

    def __init__(self, rmq: Any) -> None:
        self.broker = InMemoryBroker().start()

    def consume(self, *receivers: str, max_messages: int | None = None) -> None:
        if max_messages is not None:
            self.broker.run_ready(limit=max_messages)
        else:
            self.broker.run_until_idle()

    def delete_queue(self, receiver: str) -> None:
        self.broker.delete_queue(receiver)

    def wait_orphaned(self, count: int) -> None:
        orphans = self.broker.names.orphan_queue
        while self.broker.depth(orphans) < count:
            due = self.broker.model.next_expiry_ms()
            assert due is not None, "nothing left in the delay levels"
            self.broker.model.advance_to(due)

    def close(self) -> None:
        self.broker.stop()


def outcome(rmq: Any) -> Outcome:
    log = read_log(rmq.log)
    return {
        "starts": sorted(
            Counter(
                (e["receiver"], e["id"], e["attempt"]) for e in log if e["event"] == "start"
            ).items()
        ),
        "done": sorted(
            Counter((e["receiver"], e["id"]) for e in log if e["event"] == "done").items()
        ),
        "parked": sorted(
            (
                r.receiver.rsplit(".", 1)[-1],
                r.message_id,
                r.reason,
                r.attempts,
                r.status,
                r.park_count,
                r.requeue_count,
            )
            for r in ParkedMessage.objects.all()
        ),
    }


def run_both(rmq: Any, scenario: Callable[[Any], None]) -> tuple[Outcome, Outcome]:
    results = []
    for kind in (Real, Memory):
        for model in (ParkedMessage, DeliveryStart, InboxEntry, OutboxMessage):
            model.objects.all().delete()
        rmq.log.write_text("")
        harness = kind(rmq)
        try:
            scenario(harness)
        finally:
            harness.close()
        results.append(outcome(rmq))
    real, memory = results
    assert memory == real, f"in-memory differs from RabbitMQ:\n{memory}\n!=\n{real}"
    return real, memory


def starts(*items: tuple[str, str, int]) -> list[Any]:
    return sorted(Counter(items).items())


def test_happy_path(rmq):
    def scenario(h):
        work.send({"id": "h1"}, message_id="h1")
        other.send({"id": "h2"}, message_id="h2")
        h.consume()

    real, _ = run_both(rmq, scenario)
    assert real["starts"] == starts(("alpha", "h1", 1), ("beta", "h1", 1), ("gamma", "h2", 1))
    assert real["parked"] == []


def test_retries_count_exactly_then_park(rmq):
    def scenario(h):
        work.send({"id": "t1", "fail": 2}, message_id="t1")  # both succeed on attempt 3
        work.send({"id": "t2", "fail": "always", "only": ["alpha"]}, message_id="t2")
        other.send({"id": "t3", "fail": "always"}, message_id="t3")  # gamma: 10 attempts
        h.consume()

    real, _ = run_both(rmq, scenario)
    expected = [("alpha", "t1", a) for a in (1, 2, 3)] + [("beta", "t1", a) for a in (1, 2, 3)]
    expected += [("alpha", "t2", a) for a in (1, 2, 3)] + [("beta", "t2", 1)]
    expected += [("gamma", "t3", a) for a in range(1, 11)]
    assert real["starts"] == starts(*expected)
    assert real["done"] == sorted(
        Counter([("alpha", "t1"), ("beta", "t1"), ("beta", "t2")]).items()
    )
    assert real["parked"] == [
        ("alpha", "t2", "exhausted", 3, "parked", 1, 0),
        ("gamma", "t3", "exhausted", 10, "parked", 1, 0),
    ]


def test_receiver_asks_for_a_delay(rmq):
    seen: dict[str, list[float]] = {}

    def scenario(h):
        other.send({"id": "d1", "fail": 1, "retry_delay": 0.7}, message_id="d1")
        h.consume()
        seen[h.name] = [e["t"] for e in read_log(rmq.log) if e["event"] == "start"]

    real, _ = run_both(rmq, scenario)
    assert real["starts"] == starts(("gamma", "d1", 1), ("gamma", "d1", 2))
    gap = seen["rabbitmq"][1] - seen["rabbitmq"][0]
    assert 0.65 <= gap < 1.5, gap  # the real delay, held by the broker's levels


def test_reject_and_undecodable_park_at_once(rmq):
    def scenario(h):
        work.send({"id": "r1", "reject": True, "only": ["beta"]}, message_id="r1")
        work.send(b"{not json", content_type="application/json", message_id="u1")
        h.consume()

    real, _ = run_both(rmq, scenario)
    assert real["starts"] == starts(("alpha", "r1", 1), ("beta", "r1", 1))
    assert real["parked"] == [
        ("alpha", "u1", "undecodable", 1, "parked", 1, 0),
        ("beta", "r1", "rejected", 1, "parked", 1, 0),
        ("beta", "u1", "undecodable", 1, "parked", 1, 0),
    ]


def test_retry_whose_queue_vanished_is_parked_as_orphaned(rmq):
    def scenario(h):
        other.send({"id": "o1", "fail": 1, "retry_delay": 1}, message_id="o1")
        h.consume("gamma", max_messages=1)  # fails once: the copy waits 1 s in the levels
        h.delete_queue("gamma")
        h.wait_orphaned(1)
        h.consume("gamma")

    real, _ = run_both(rmq, scenario)
    assert real["starts"] == starts(("gamma", "o1", 1))
    assert real["parked"] == [("gamma", "o1", "orphaned", 2, "parked", 1, 0)]


@pytest.mark.parametrize("mode", [parking.MODE_RECEIVER, parking.MODE_TOPIC])
def test_requeue_puts_parked_messages_back_to_work(rmq, mode):
    def scenario(h):
        work.send({"id": "q1", "fail": "always", "only": ["alpha"]}, message_id="q1")
        h.consume()
        result = parking.requeue(ParkedMessage.objects.all(), user="contract", mode=mode)
        assert result.requeued == 1
        h.consume()

    real, _ = run_both(rmq, scenario)
    alpha = [("alpha", "q1", a) for a in (1, 2, 3)] * 2
    beta = [("beta", "q1", 1)] * (2 if mode == parking.MODE_TOPIC else 1)
    assert real["starts"] == starts(*alpha, *beta)
    # Back in its own row: parked twice, requeued once.
    assert real["parked"] == [("alpha", "q1", "exhausted", 3, "parked", 2, 1)]


def test_the_in_memory_clock_runs_a_long_schedule_at_once(rmq):
    """A day of retries (1 h apart) in milliseconds of wall time, in the delay levels."""
    with InMemoryBroker() as broker:
        other.send({"id": "slow", "fail": 2, "retry_delay": 3600}, message_id="slow")
        found: list[list[Any]] = []

        def run() -> None:
            try:
                found.append(broker.run_until_idle())
            finally:
                connections.close_all()

        running = threading.Thread(target=run, daemon=True)
        running.start()
        # Virtual time: two hours of delays, not slept. Done within a generous ten minutes,
        # however loaded the host; a broker that slept them would still be at it.
        running.join(600)
        assert not running.is_alive(), "two hours of delays were slept, not skipped"
    (runs,) = found
    assert [(r.attempt, r.outcome, r.delay) for r in runs] == [
        (1, "retried", 3600.0),
        (2, "retried", 3600.0),
        (3, "handled", None),
    ]
    assert runs[-1].at == pytest.approx(7200, abs=1)


def test_outbox_sends_what_committed_only(rmq):
    from django.db import transaction

    def scenario(h):
        with transaction.atomic():
            other.send({"id": "x1"}, message_id="x1", outbox=True)
            work.send({"id": "x2"}, message_id="x2", outbox=True)
        with pytest.raises(RuntimeError), transaction.atomic():
            other.send({"id": "x3"}, message_id="x3", outbox=True)
            raise RuntimeError("rolled back: never sent")
        h.consume()

    real, _ = run_both(rmq, scenario)
    assert real["starts"] == starts(("gamma", "x1", 1), ("alpha", "x2", 1), ("beta", "x2", 1))


def test_idempotent_receiver_runs_a_duplicate_once(rmq, effects):
    from tests.testapp.models import Effect

    keys: dict[str, list[tuple[str, int]]] = {}

    def scenario(h):
        Effect.objects.all().delete()
        for _ in range(2):  # the same message twice, then one failing once after its write
            effects.send({"id": "i1"}, message_id="i1")
        effects.send({"id": "i2", "fail": 1}, message_id="i2")
        h.consume()
        keys[h.name] = sorted(Effect.objects.values_list("key", "attempt"))

    real, _ = run_both(rmq, scenario)
    assert real["starts"] == starts(
        ("writes_effect", "i1", 1), ("writes_effect", "i2", 1), ("writes_effect", "i2", 2)
    )
    assert keys["rabbitmq"] == keys["in-memory"] == [("i1", 1), ("i2", 2)]
