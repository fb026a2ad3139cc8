"""Background requeue operations on the real broker: the selection fixed at the click, the
canary, the ramp and the rate, stop at the first new failure, pause and cancel; a consumer
process (its housekeeping thread) advances them and reports its copies handled."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_rmq_retry.models import (
    ItemState,
    OperationState,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from django_rmq_retry.parking import operations
from tests.conftest import read_log, start_consumer, wait_for
from tests.test_admin import ALPHA

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def park_rows(rmq, bodies: list[dict]) -> list[ParkedMessage]:
    """Rows parked from alpha's real queue, one per body (each body's ``id`` is its own)."""
    now = timezone.now()
    rows = []
    for body in bodies:
        raw = json.dumps(body).encode()
        rows.append(
            ParkedMessage(
                park_key=uuid.uuid4().hex,
                receiver=ALPHA,
                queue=rmq.queue("alpha"),
                exchange=rmq.names.work_exchange,
                routing_key="test.work",
                message_id=f"m{body['id']}",
                body=raw,
                body_size=len(raw),
                content_type="application/json",
                properties={
                    "content_type": "application/json",
                    "delivery_mode": 2,
                    "message_id": f"m{body['id']}",
                },
                headers={},
                reason="exhausted",
                error_type="tests.testapp.consumers.Boom",
                error_message="boom",
                attempts=3,
                parked_at=now,
            )
        )
    return ParkedMessage.objects.bulk_create(rows, batch_size=1000)


def run_until_settled(rmq, op: RequeueOperation, timeout: float) -> tuple[RequeueOperation, str]:
    child = start_consumer(rmq.prefix, rmq.log, "alpha")
    try:
        settled = wait_for(
            lambda: (
                RequeueOperation.objects.get(pk=op.pk).state
                not in (OperationState.RUNNING, OperationState.PAUSED)
            ),
            timeout=timeout,
            interval=0.2,
        )
    finally:
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    op.refresh_from_db()
    assert settled, (op.state, op.state_reason, out[-2000:])
    return op, out


def handled_ids(rmq) -> Counter[int]:
    return Counter(e["id"] for e in read_log(rmq.log) if e["event"] == "done")


def test_the_selection_is_fixed_when_the_operation_is_created(rmq):
    first = park_rows(rmq, [{"id": i} for i in range(5)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", canary=1)
    park_rows(rmq, [{"id": i} for i in range(5, 8)])  # parked after the click
    assert op.total == 5
    ids = set(RequeueItem.objects.filter(operation=op).values_list("parked_id", flat=True))
    assert ids == {row.pk for row in first}
    # Paused: no step; cancelled: no resume.
    assert operations.pause(op.pk, "ops")
    assert operations.advance(op.pk) is None
    assert operations.cancel(op.pk, "other")
    assert not operations.resume(op.pk, "ops")
    op.refresh_from_db()
    assert (op.state, op.state_changed_by) == (OperationState.CANCELLED, "other")
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 8


def test_canary_ramp_and_rate_reach_the_receiver_once_per_row(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    n, rate = 300, 100.0
    park_rows(rmq, [{"id": i} for i in range(n)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", canary=5, ramp=True, rate=rate)
    started = time.monotonic()
    op, _ = run_until_settled(rmq, op, timeout=120)
    assert (op.state, op.total, op.sent, op.handled, op.failed_again) == (
        OperationState.DONE,
        n,
        n,
        n,
        0,
    ), op.state_reason
    assert handled_ids(rmq) == Counter(range(n))  # exactly once each
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 0
    progress = operations.progress(op)
    assert progress.achieved_rate is not None  # reported, not asserted: no timed assertions
    print(
        f"rate asked {rate}/s, achieved {progress.achieved_rate}/s, "
        f"wall {time.monotonic() - started:.1f}s"
    )


def test_stops_at_the_first_new_failure_and_the_rest_stays_parked(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    bodies = [{"id": i} for i in range(40)]
    bodies[12] = {"id": 12, "fail": "always"}  # still broken
    park_rows(rmq, bodies)
    op = operations.create(ParkedMessage.objects.all(), user="ops", ramp=True)
    op, _ = run_until_settled(rmq, op, timeout=120)
    assert op.state == OperationState.STOPPED
    assert "failed again" in op.state_reason and "Boom" in op.state_reason
    assert op.failed_again == 1
    left = RequeueItem.objects.filter(operation=op, state=ItemState.PENDING).count()
    assert left > 0  # the ramp waited for batch outcomes: the rest never went
    parked = ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count()
    assert parked == left + 1  # the one that failed again is parked again
    handled = handled_ids(rmq)
    assert set(handled.values()) == {1} and 12 not in handled
    assert len(handled) == op.handled


def test_rmq_requeue_runs_an_operation_with_the_same_options(rmq):
    from io import StringIO

    call_command("rmq_consume", setup_only=True, verbosity=0)
    park_rows(rmq, [{"id": i} for i in range(20)])
    child = start_consumer(rmq.prefix, rmq.log, "alpha", "--no-relay")  # steps nothing
    out, err = StringIO(), StringIO()
    try:
        call_command(
            "rmq_requeue",
            "--canary",
            "2",
            "--rate",
            "50",
            "--ramp",
            "--stop-on-failure",
            stdout=out,
            stderr=err,
        )
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)
    op = RequeueOperation.objects.get()
    assert (op.canary, op.rate, op.ramp, op.stop_on_failure) == (2, 50.0, True, True)
    assert op.state == OperationState.DONE and op.handled == 20
    assert f"Requeue operation #{op.pk}: 20 message(s)." in out.getvalue()
    assert "Done: 20 handled" in out.getvalue()
    assert "operation #" in err.getvalue()  # the progress report, on the command's stderr
    assert handled_ids(rmq) == Counter(range(20))


@pytest.mark.slow
def test_a_10000_row_group_with_canary_and_rate_reaches_its_receiver_once_per_row(rmq):
    """The issue's count: 10,000 rows of one failure group, canary 10, 500 msg/s asked."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    n, rate = 10_000, 500.0
    park_rows(rmq, [{"id": i} for i in range(n)])
    op = operations.create(
        ParkedMessage.objects.filter(fingerprint=""), user="ops", canary=10, rate=rate
    )
    assert op.total == n
    op, _ = run_until_settled(rmq, op, timeout=600)
    assert (op.state, op.sent, op.handled, op.failed_again) == (OperationState.DONE, n, n, 0)
    assert handled_ids(rmq) == Counter(range(n))
    achieved = operations.progress(op).achieved_rate
    print(f"\n10,000 rows: rate asked {rate}/s, achieved {achieved}/s")
    assert achieved is not None  # reported, not asserted: no timed assertions
