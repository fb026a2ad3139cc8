"""The contract for per-key order: the in-memory broker holds and releases keys as the real
consumer on RabbitMQ does. Each scenario runs on both (``test_contract``'s harnesses) and
must give the same runs, in the same order per key, the same parked rows and the same holds
left, and what the scenario states."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from django_rmq_retry import Topic, parking, receiver
from django_rmq_retry.models import HeldMessage, KeyHold, ParkedMessage
from tests.contract.test_contract import Memory, Real

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

ordered_events = Topic("contract.ordered")


class Journal:
    """Every run of the ordered receiver, in the order it happened, and what fails."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int, str, int]] = []  # (key, n, event, attempt)
        self.failing: dict[tuple[str, int], int] = {}  # attempts left to fail

    def outcome(self) -> dict[str, Any]:
        done: dict[str, list[int]] = defaultdict(list)
        for key, n, event, _attempt in self.runs:
            if event == "done":
                done[key].append(n)
        return {
            "runs": sorted(self.runs),
            "done_in_order": dict(done),
            "parked": sorted(
                (r.message_id, r.reason, r.attempts, r.status, r.park_count, r.requeue_count)
                for r in ParkedMessage.objects.all()
            ),
            "holds": sorted((h.key, h.state, h.messages.count()) for h in KeyHold.objects.all()),
        }


@pytest.fixture
def journal(registry_snapshot: None, rmq: Any) -> Journal:
    j = Journal()

    @receiver(
        ordered_events,
        ordering_key="key",
        retry={"max_attempts": 3, "initial_delay": 0.2, "jitter": "none"},
    )
    def apply_in_order(message: Any, **kwargs: Any) -> None:
        key, n = message.body["key"], message.body["n"]
        left = j.failing.get((key, n), 0)
        if left:
            j.failing[(key, n)] = left - 1
            j.runs.append((key, n, "failed", message.attempt))
            raise ConnectionError(f"{key}/{n}")
        j.runs.append((key, n, "done", message.attempt))

    rmq.setup()
    return j


def run_both(rmq: Any, journal: Journal, scenario: Callable[[Any], None]) -> dict[str, Any]:
    results = []
    for kind in (Real, Memory):
        for model in (HeldMessage, KeyHold, ParkedMessage):
            model.objects.all().delete()
        journal.runs.clear()
        journal.failing.clear()
        harness = kind(rmq)
        try:
            scenario(harness)
        finally:
            harness.close()
        results.append(journal.outcome())
    real, memory = results
    assert memory == real, f"in-memory differs from RabbitMQ:\n{memory}\n!=\n{real}"
    return real


def _send(*items: tuple[str, int]) -> None:
    for key, n in items:
        ordered_events.send({"key": key, "n": n}, message_id=f"{key}-{n}")


def test_a_retry_holds_its_key_and_the_rest_run_in_order(journal: Journal, rmq: Any) -> None:
    def scenario(h: Any) -> None:
        journal.failing[("a", 0)] = 1
        journal.failing[("a", 2)] = 1
        _send(("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2))
        h.consume()

    real = run_both(rmq, journal, scenario)
    assert real["done_in_order"] == {"a": [0, 1, 2, 3], "b": [0, 1, 2]}
    assert ("a", 0, "failed", 1) in real["runs"] and ("a", 0, "done", 2) in real["runs"]
    assert ("a", 2, "failed", 1) in real["runs"] and ("a", 2, "done", 2) in real["runs"]
    assert real["parked"] == [] and real["holds"] == []


def test_a_parked_message_holds_its_key_until_requeued(journal: Journal, rmq: Any) -> None:
    seen: list[Any] = []

    def scenario(h: Any) -> None:
        journal.failing[("a", 0)] = 3  # every attempt: parked
        _send(("a", 0), ("a", 1), ("b", 0), ("a", 2))
        h.consume()
        seen.append(journal.outcome())
        parking.requeue(ParkedMessage.objects.all(), user="contract")
        h.consume()

    real = run_both(rmq, journal, scenario)
    held, memory_held = seen
    assert held == memory_held
    assert held["holds"] == [("a", "parked", 2)]
    assert held["done_in_order"] == {"b": [0]}
    assert real["done_in_order"] == {"a": [0, 1, 2], "b": [0]}
    assert real["parked"] == [("a-0", "exhausted", 3, "requeued", 1, 1)]
    assert real["holds"] == []
