"""Replay on close, on the real broker: what a dependency's exception parked before the
trip is requeued by the breaker's operation when an operator closes it, and handled by a
consumer (the requeue operation's steps run in its housekeeping thread)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from django_rmq_retry.breakers.replay import started_by
from django_rmq_retry.models import ParkedMessage, ParkedStatus, RequeueOperation, RetryPolicy
from tests.conftest import read_log
from tests.faults.test_dependency_outage import breakerapp  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def test_closing_the_breaker_replays_what_the_outage_parked(
    rmq,
    breakerapp,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    flag = tmp_path / "payments-down"
    flag.write_text("down")
    monkeypatch.setenv("RMQ_TEST_DOWN_FLAG", str(flag))
    charge = f"{breakerapp.__name__}.charge"
    RetryPolicy.objects.create(receiver=charge, max_attempts=1, jitter="none")
    for i in range(2):  # two failures: parked at once (one attempt), the breaker stays closed
        breakerapp.charge_topic.send({"id": i})
    call_command("rmq_consume", max_messages=2, verbosity=0)
    assert ParkedMessage.objects.filter(receiver=charge, status=ParkedStatus.PARKED).count() == 2

    call_command("rmq_dependencies", "--open", "payments", stdout=io.StringIO())
    flag.unlink()  # the provider is back; the operator closes the breaker
    call_command("rmq_dependencies", "--close", "payments", stdout=io.StringIO())
    op = RequeueOperation.objects.get()
    assert op.created_by == started_by("payments") and op.total == 2 and op.ramp

    for _run in range(20):  # each run steps the operation and handles what it sent
        call_command("rmq_consume", max_idle_time=1, verbosity=0)
        op.refresh_from_db()
        if op.state == "done":
            break
    assert op.state == "done" and op.handled == 2
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 0
    done = {
        e["id"] for e in read_log(rmq.log) if e["receiver"] == "charge" and e["event"] == "done"
    }
    assert done == {0, 1}
