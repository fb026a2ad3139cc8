"""The breakers' rows (``breakers.state``) on the real database: the count is the cluster's,
each transition one conditional update that one process wins, said once; the settings,
``depends_on=`` and the system checks that guard them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.test import override_settings

from django_rmq_retry import Topic, receiver
from django_rmq_retry.breakers import state
from django_rmq_retry.breakers.announce import CLOSED, TRIPPED
from django_rmq_retry.checks import check_settings
from django_rmq_retry.core.breaker import Breaker, State
from django_rmq_retry.models import Dependency, DependencyEvent, DependencyFailure
from django_rmq_retry.registry import Registry, default_registry

pytestmark = pytest.mark.django_db

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
PAYMENTS = {
    "EXCEPTIONS": ["builtins.ConnectionError"],
    "TRIP_FAILURES": 3,
    "TRIP_WINDOW": 30,
    "PROBE_AFTER": 10,
    "PROBE_BACKOFF_MAX": 40,
}
received: list = []


def capture(alert) -> None:
    received.append(alert)


@pytest.fixture
def payments(settings):
    received.clear()
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "DEPENDENCIES": {"payments": PAYMENTS},
        "ALERT_HANDLER": "tests.test_breaker_state.capture",
    }
    return "payments"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_failures_from_several_processes_trip_it_once(payments):
    # Three processes each see one failure: the third trips it (the count is the cluster's).
    assert state.record_failure(payments, "ConnectionError", "refused", now=at(0)).state is (
        State.CLOSED
    )
    state.record_failure(payments, "ConnectionError", "refused", now=at(1))
    b = state.record_failure(payments, "ConnectionError", "reset", now=at(2))
    assert b.state is State.OPEN and b.trips == 1 and "3 failure(s) in 30s" in b.reason
    assert DependencyFailure.objects.count() == 0  # the next trip counts anew
    # A failure that arrives after the trip (in flight elsewhere) changes nothing.
    again = state.record_failure(payments, "ConnectionError", "late", now=at(3))
    assert again.state is State.OPEN and again.trips == 1
    events = list(DependencyEvent.objects.values_list("from_state", "to_state"))
    assert events == [("closed", "open")]
    assert [a.kind for a in received] == [TRIPPED]
    assert "payments" in received[0].text


def test_failures_outside_the_window_do_not_count(payments):
    state.record_failure(payments, "ConnectionError", "x", now=at(0))
    state.record_failure(payments, "ConnectionError", "x", now=at(20))
    b = state.record_failure(payments, "ConnectionError", "x", now=at(40))  # at(0) is gone
    assert b.state is State.CLOSED
    assert state.failures_in_window(payments, now=at(40)) == 2
    assert DependencyFailure.objects.filter(at=at(0)).count() == 0  # pruned


def test_a_stale_snapshot_loses_the_conditional_update(payments):
    before = state.read(payments)
    opened = Breaker(state=State.OPEN, reason="x", version=before.version + 1)
    assert state.step(payments, before, opened, by="a", now=at(0))
    assert not state.step(payments, before, opened, by="b", now=at(0))  # b read too early
    assert DependencyEvent.objects.count() == 1


def test_one_probe_for_the_cluster_then_close_once(payments):
    for i in range(3):
        state.record_failure(payments, "ConnectionError", "x", now=at(i))
    assert not state.claim(payments, "host:1", now=at(5))  # not due before PROBE_AFTER
    assert state.claim(payments, "host:1", now=at(12))
    assert not state.claim(payments, "host:2", now=at(12))  # one probe at a time
    assert state.claim(payments, "host:1", now=at(12))  # (its own claim still holds)
    failed = state.probe_result(payments, "host:1", ("ConnectionError", "down"), now=at(13))
    assert failed.state is State.OPEN and failed.probe_wait == 20
    assert not state.claim(payments, "host:2", now=at(30))
    assert state.claim(payments, "host:2", now=at(33))
    # A late word from the first owner changes nothing; the second owner's closes it.
    assert state.probe_result(payments, "host:1", None, now=at(34)).state is State.HALF_OPEN
    closed = state.probe_result(payments, "host:2", None, now=at(35))
    assert closed.state is State.CLOSED and closed.trips == 1
    assert [a.kind for a in received] == [TRIPPED, CLOSED]
    kinds = list(DependencyEvent.objects.order_by("at", "id").values_list("from_state", "to_state"))
    assert kinds == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    assert [e.to_state for e in state.history(payments, limit=2)] == ["closed", "half_open"]


def test_a_probe_owner_that_dies_is_replaced_after_its_lease(payments):
    state.force(payments, State.OPEN, "alice", now=at(0))
    assert state.claim(payments, "host:1", now=at(10))
    assert not state.claim(payments, "host:2", now=at(30))
    assert state.claim(payments, "host:2", now=at(71))  # host:1's lease lapsed
    assert state.drop_probe(payments, "host:2", now=at(72)).state is State.OPEN
    assert state.claim(payments, "host:3", now=at(82))


def test_the_operator_opens_and_closes(payments):
    assert state.force(payments, State.OPEN, "alice", now=at(0))
    assert not state.force(payments, State.OPEN, "alice", now=at(1))
    row = Dependency.objects.get(name=payments)
    assert (row.state, row.trips, row.reason) == ("open", 1, "opened by alice")
    assert state.force(payments, State.CLOSED, "bob", now=at(2))
    assert [a.kind for a in received] == [TRIPPED, CLOSED]
    assert received[1].by == "bob"


def test_read_all_creates_missing_rows_closed(payments):
    got = state.read_all([payments, payments])
    assert list(got) == [payments] and got[payments].state is State.CLOSED
    assert Dependency.objects.count() == 1


# Settings, depends_on= and the system checks ----------------------------------------------
def ids(conf):
    with override_settings(RMQ_RETRY=conf):
        return [m.id for m in check_settings()]


def test_checks_name_a_bad_dependency_entry_and_a_bad_exception_path():
    assert "django_rmq_retry.E018" not in ids({"DEPENDENCIES": {"payments": PAYMENTS}})
    assert "django_rmq_retry.E018" in ids({"DEPENDENCIES": {"payments": {"EXCEPTIONS": []}}})
    for path in ("builtins.NoSuchError", "nowhere.at_all.Error", "django.conf.settings"):
        conf = {"DEPENDENCIES": {"payments": {**PAYMENTS, "EXCEPTIONS": [path]}}}
        assert "django_rmq_retry.E018" in ids(conf), path


def test_checks_name_an_unknown_depends_on():
    topic = Topic("tests.breaker.checks")

    def charge(message, **kwargs):
        return None

    default_registry.register(charge, [topic], depends_on=["payments", "mail"])
    try:
        with override_settings(RMQ_RETRY={"DEPENDENCIES": {"payments": PAYMENTS}}):
            messages = [m for m in check_settings() if m.id == "django_rmq_retry.E019"]
        assert len(messages) == 1 and "'mail'" in messages[0].msg
        assert "'payments'" not in messages[0].msg
    finally:
        default_registry.unregister(charge)


def test_depends_on_takes_a_name_or_a_list():
    registry = Registry()
    topic = Topic("tests.breaker.depends")

    @receiver(topic, depends_on="payments", registry=registry)
    def one(message, **kwargs):
        return None

    @receiver(topic, depends_on=["payments", "mail", "payments"], registry=registry)
    def two(message, **kwargs):
        return None

    @receiver(topic, registry=registry)
    def three(message, **kwargs):
        return None

    by_name = {r.name.split(".")[-1]: r.depends_on for r in registry.all()}
    assert by_name == {"one": ("payments",), "two": ("payments", "mail"), "three": ()}
    with pytest.raises(Exception, match="depends_on"):
        registry.register(lambda message, **kw: None, [topic], depends_on=[3])


def test_without_a_handler_the_admins_get_one_mail_per_trip_and_close(settings, mailoutbox):
    settings.ADMINS = [("Ops", "ops@example.com")]
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "DEPENDENCIES": {"payments": PAYMENTS},
        "ALERT_HANDLER": None,
    }
    for i in range(5):  # the fourth and fifth come after the trip: no second mail
        state.record_failure("payments", "ConnectionError", "refused", now=at(i))
    state.force("payments", State.CLOSED, "alice", now=at(9))
    assert [m.subject for m in mailoutbox] == [
        f"{settings.EMAIL_SUBJECT_PREFIX}Dependency payments: {TRIPPED}",
        f"{settings.EMAIL_SUBJECT_PREFIX}Dependency payments: {CLOSED}",
    ]
    assert "3 failure(s) in 30s" in mailoutbox[0].body
