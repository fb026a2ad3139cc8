"""A dependency's breaker in the in-memory broker, on its virtual clock: a 45 s outage
trips it, the queue waits, one probe per wait (doubling), and the probe that succeeds
closes it; nothing parked, nothing lost, the independent receiver never waits."""

from __future__ import annotations

import pytest

from django_rmq_retry import Topic, receiver
from django_rmq_retry.breakers import state
from django_rmq_retry.core.breaker import State
from django_rmq_retry.models import DependencyEvent, ParkedMessage
from django_rmq_retry.testing import InMemoryBroker

charged = Topic("breaker.memory.charge")
mailed = Topic("breaker.memory.mail")
DOWN_FOR = 45.0


@pytest.fixture
def payments(settings):
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "DEPENDENCIES": {
            "payments": {
                "EXCEPTIONS": ["builtins.ConnectionError"],
                "TRIP_FAILURES": 3,
                "TRIP_WINDOW": 30,
                "PROBE_AFTER": 10,
                "PROBE_BACKOFF_MAX": 40,
            }
        },
        "ALERT_HANDLER": None,
    }


@pytest.mark.django_db
def test_an_outage_trips_waits_probes_and_closes(payments, registry_snapshot):
    calls: list[float] = []
    broker: InMemoryBroker

    @receiver(charged, depends_on="payments", retry={"max_attempts": 3, "initial_delay": 1})
    def charge(message, **kwargs):
        calls.append(broker.elapsed)
        if broker.elapsed < DOWN_FOR:
            raise ConnectionError("payments is down")

    @receiver(mailed)
    def mail(message, **kwargs):
        return None

    with InMemoryBroker() as broker:
        for i in range(20):
            charged.send({"order": i})
        for i in range(5):
            mailed.send({"order": i})
        runs = broker.run_until_idle()

    assert ParkedMessage.objects.count() == 0  # the outage parked nothing
    charge_runs = broker.runs_of(charge)
    handled = [r for r in charge_runs if r.outcome == "handled"]
    assert len(handled) == 20  # all handled after recovery, none lost
    assert {r.outcome for r in broker.runs_of(mail)} == {"handled"}  # never given back
    # Before the trip: 3 failures (the last one given back, the two before retried). Then
    # one probe per wait: at 10 s (fails, wait 20), at 30 s (fails, wait 40), at 70 s
    # (succeeds): the receiver ran 3 times while the breaker was not closed.
    failed = [t for t in calls if t < DOWN_FOR]
    assert len(failed) == 5
    probes = failed[3:]
    assert probes[0] >= 10 and probes[1] >= probes[0] + 20
    assert min(t for t in calls if t >= DOWN_FOR) >= probes[1] + 40
    outcomes = [r.outcome for r in charge_runs]
    assert outcomes.count("retried") == 2 and "parked" not in outcomes
    b = state.read("payments")
    assert b.state is State.CLOSED and b.trips == 1
    history = list(
        DependencyEvent.objects.order_by("at", "id").values_list("from_state", "to_state")
    )
    assert history == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    assert len(runs) == len(broker.runs)


@pytest.mark.django_db
def test_a_failure_that_is_not_listed_follows_the_retry_policy(payments, registry_snapshot):
    @receiver(charged, depends_on="payments", retry={"max_attempts": 2, "initial_delay": 1})
    def charge(message, **kwargs):
        raise ValueError("a bug, not an outage")

    with InMemoryBroker() as broker:
        for i in range(5):
            charged.send({"order": i})
        broker.run_until_idle()
    assert ParkedMessage.objects.count() == 5
    assert state.read("payments").state is State.CLOSED


@pytest.mark.django_db
def test_on_close_what_the_outage_parked_is_replayed_by_the_breaker(payments, registry_snapshot):
    from django_rmq_retry.breakers.replay import started_by
    from django_rmq_retry.models import ParkedStatus, RequeueOperation
    from django_rmq_retry.parking import operations

    broker: InMemoryBroker

    @receiver(charged, depends_on="payments", retry={"max_attempts": 1})
    def charge(message, **kwargs):
        if broker.elapsed < DOWN_FOR:
            raise ConnectionError("payments is down")

    @receiver(mailed, retry={"max_attempts": 1})
    def mail(message, **kwargs):
        raise ConnectionError("not a dependent receiver: never replayed by the breaker")

    with InMemoryBroker() as broker:
        mailed.send({"order": 0})
        for i in range(6):
            charged.send({"order": i})
        broker.run_until_idle()
        # Two failures parked at once (max_attempts 1) before the third tripped it.
        charge_rows = ParkedMessage.objects.filter(receiver=broker.runs_of(charge)[0].receiver)
        assert charge_rows.filter(status=ParkedStatus.PARKED).count() == 2
        op = RequeueOperation.objects.get()
        assert op.created_by == started_by("payments") and op.total == 2 and op.ramp
        assert "payments" in op.description
        for _step in range(10):  # ramped: one copy, its outcome, then the rest
            # The operation's steps wait real seconds: this test drives that clock too.
            RequeueOperation.objects.filter(pk=op.pk).update(next_at=op.created_at)
            operations.advance_due()
            broker.run_until_idle()
            op.refresh_from_db()
            if op.state == "done":
                break
        assert op.state == "done" and op.handled == 2
    assert charge_rows.filter(status=ParkedStatus.PARKED).count() == 0
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 1  # mail's
    assert len([r for r in broker.runs_of(charge) if r.outcome == "handled"]) == 6


@pytest.mark.django_db
def test_a_probe_that_fails_with_another_exception_closes_it(payments, registry_snapshot):
    """The probe raised something the dependency's EXCEPTIONS do not list: the dependency
    answered, so the breaker closes, and that message follows its retry policy."""
    broker: InMemoryBroker
    bugs: list[int] = []

    @receiver(charged, depends_on="payments", retry={"max_attempts": 2, "initial_delay": 1})
    def charge(message, **kwargs):
        if broker.elapsed < 5:
            raise ConnectionError("payments is down")
        if not bugs:  # the first call after the outage: the probe
            bugs.append(message.body["order"])
            raise ValueError("a bug of ours, the dependency is fine")

    with InMemoryBroker() as broker:
        for i in range(6):
            charged.send({"order": i})
        broker.run_until_idle()
    history = list(
        DependencyEvent.objects.order_by("at", "id").values_list("from_state", "to_state")
    )
    assert history == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert len(bugs) == 1 and ParkedMessage.objects.count() == 0
    handled = [r for r in broker.runs_of(charge) if r.outcome == "handled"]
    assert len(handled) == 6  # the probe's message too, at its next attempt
