"""Which dependent queues a consumer takes from (``consumer.dependency_consumers``), on
plain data: no broker, no database. The breakers' states are set in the process's watch
as its thread would read them; the consumers are a fake that records what it is told."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from django_rmq_retry import Topic
from django_rmq_retry.consumer import dependency_consumers, dependency_gate
from django_rmq_retry.core.breaker import Breaker, State
from django_rmq_retry.registry import Registry

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


class Channel:
    """The dispatcher's side: consumers by tag, and every call in order."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.calls: list[tuple] = []
        self._n = 0

    def consume_at(self, queue: str, prefetch: int) -> None:
        self._n += 1
        self.tags[f"t{self._n}"] = queue
        self.calls.append(("consume", queue, prefetch))

    def cancel_consumer(self, tag: str) -> None:
        self.calls.append(("cancel", self.tags.pop(tag)))

    def tags_of(self, queue: str) -> list[str]:
        return [t for t, q in self.tags.items() if q == queue]

    def take(self) -> list[tuple]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def setup(monkeypatch):
    dependency_gate.forget()
    clock = [100.0]
    monkeypatch.setattr(dependency_consumers.time, "monotonic", lambda: clock[0])
    registry = Registry()
    topic = Topic("breaker.consumers")

    def charge(message, **kwargs):
        return None

    def mail(message, **kwargs):
        return None

    registry.register(charge, [topic], queue="charge", depends_on="payments")
    registry.register(mail, [topic], queue="mail")
    by_queue = {r.queue_name("p"): r for r in registry.all()}
    yield dependency_consumers.DependencyConsumers(by_queue, prefetch=20), clock
    dependency_gate.forget()


def set_state(state: State, *, mine: bool = False) -> None:
    w = dependency_gate.watch()
    owner = w.me if mine else "elsewhere:1"
    w.breakers["payments"] = Breaker(state=state, probe_owner=owner, probe_until=NOW)
    if mine:
        w.probes["payments"] = dependency_gate._Probe(NOW)
    else:
        w.probes.pop("payments", None)


def test_open_stops_the_queue_probe_takes_one_close_ramps_back(setup):
    consumers, clock = setup
    channel = Channel()
    set_state(State.CLOSED)
    for queue in ("p.charge", "p.mail"):  # as the dispatcher does on a new connection
        if consumers.consumes_at_start(queue):
            channel.consume_at(queue, 20)
    channel.take()

    set_state(State.OPEN)
    consumers.adjust(channel)
    assert channel.take() == [("cancel", "p.charge")]
    consumers.adjust(channel)
    assert channel.take() == []  # stays stopped; p.mail is never touched

    set_state(State.HALF_OPEN)  # another process probes: nothing to do here
    consumers.adjust(channel)
    assert channel.take() == []
    set_state(State.HALF_OPEN, mine=True)  # this process probes: one message at a time
    consumers.adjust(channel)
    assert channel.take() == [("consume", "p.charge", 1)]

    set_state(State.CLOSED)
    consumers.adjust(channel)
    assert channel.take() == [("cancel", "p.charge"), ("consume", "p.charge", 1)]
    prefetches = []
    for _ in range(10):
        clock[0] += dependency_consumers.RAMP_STEP
        consumers.adjust(channel)
        prefetches += [c[2] for c in channel.take() if c[0] == "consume"]
    assert prefetches == [2, 4, 8, 16, 20]  # then PREFETCH, and no more changes
    assert len(channel.tags_of("p.charge")) == 1
    assert channel.tags_of("p.mail") == ["t2"]  # its first consumer, never touched


def test_a_new_connection_does_not_consume_a_queue_whose_breaker_is_open(setup):
    consumers, _clock = setup
    set_state(State.OPEN)
    assert not consumers.consumes_at_start("p.charge")
    assert consumers.consumes_at_start("p.mail")
    channel = Channel()
    consumers.adjust(channel)
    assert channel.take() == []  # nothing to cancel: it never consumed
    consumers.reset()
    set_state(State.CLOSED)
    consumers.adjust(channel)  # closed meanwhile: consumed again, ramped
    assert channel.take() == [("consume", "p.charge", 1)]
