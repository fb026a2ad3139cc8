"""Background requeue operations as a state machine, on the real broker: what an operator
sets stands against a step in flight, a resume after a stop sends the rest, every refusal
is counted, a step longer than its lease keeps it, and no step recounts the items."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from django_rmq_retry.models import (
    ItemState,
    OperationState,
    ParkedClaim,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from django_rmq_retry.parking import operations, requeuing
from tests import waiting
from tests.conftest import start_consumer
from tests.test_operations import handled_ids, park_rows, run_until_settled

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def settings_with(**values: Any) -> Any:
    return override_settings(RMQ_RETRY={**settings.RMQ_RETRY, **values})


def once_confirmed(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """``action`` runs once the broker confirmed a requeue's first batch, before the requeue
    marks its rows: where an operator's click meets a step in flight."""
    real = requeuing.get_publisher
    ran: list[bool] = []

    class Hooked:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def stream_batches(self, batches: Any, answered: Any, **kwargs: Any) -> Any:
            def hooked(batch: Any) -> None:
                if not ran:
                    ran.append(True)
                    action()
                answered(batch)

            return self.inner.stream_batches(batches, hooked, **kwargs)

    monkeypatch.setattr(requeuing, "get_publisher", lambda *a, **k: Hooked(real(*a, **k)))


def item_states(op: RequeueOperation) -> Counter[str]:
    return Counter(RequeueItem.objects.filter(operation=op).values_list("state", flat=True))


@pytest.mark.parametrize(
    ("verb", "state"), [("pause", OperationState.PAUSED), ("cancel", OperationState.CANCELLED)]
)
def test_an_operator_s_pause_or_cancel_during_a_step_stands(rmq, monkeypatch, verb, state):
    park_rows(rmq, [{"id": i} for i in range(200)])
    op = operations.create(ParkedMessage.objects.all(), user="ops")
    once_confirmed(monkeypatch, lambda: getattr(operations, verb)(op.pk, "operator"))
    with settings_with(BATCH_SIZE=20):
        assert operations.advance(op.pk, owner="stepper") is not None
        op.refresh_from_db()
        assert (op.state, op.state_changed_by) == (state, "operator"), op.state_reason
        # The batch in flight went out and is counted; nothing after it.
        assert op.sent == 20
        assert item_states(op) == Counter({ItemState.SENT: 20, ItemState.PENDING: 180})
        assert ParkedMessage.objects.filter(status=ParkedStatus.REQUEUED).count() == 20
        assert rmq.depth(rmq.queue("alpha")) == 20
        assert operations.advance(op.pk, owner="stepper") is None


def test_controls_say_what_happened():
    now = timezone.now()
    op = RequeueOperation.objects.create(
        created_by="ops", created_at=now, updated_at=now, next_at=now, total=3
    )
    paused = operations.pause(op.pk, "ann")
    assert (paused.ok, paused.state, paused.stepping, bool(paused)) == (True, "paused", False, True)
    again = operations.pause(op.pk, "bob")
    assert (again.ok, again.state, again.changed_by, bool(again)) == (False, "paused", "ann", False)
    RequeueOperation.objects.filter(pk=op.pk).update(state=OperationState.STOPPED, failed_again=2)
    resumed = operations.resume(op.pk, "ann")
    assert (resumed.ok, resumed.state) == (True, "running")
    op.refresh_from_db()
    assert (op.failed_baseline, op.canary_from) == (2, op.sent)
    operations.pause(op.pk, "ann")
    RequeueOperation.objects.filter(pk=op.pk).update(state=OperationState.STOPPED)
    assert operations.cancel(op.pk, "bob").state == "cancelled"  # a stopped one too
    assert not operations.resume(op.pk, "ann")
    assert operations.progress(RequeueOperation.objects.get(pk=op.pk)).actions == ()
    assert operations.pause(10**9, "ann") == operations.Control(False, "", False)


@pytest.mark.parametrize(
    ("verb", "said"), [("pause", "paused"), ("resume", "resumed"), ("cancel", "cancelled")]
)
def test_rmq_operations_says_what_the_control_did(verb, said):
    import io

    from django.core.management import call_command

    now = timezone.now()
    state = OperationState.PAUSED if verb == "resume" else OperationState.RUNNING
    op = RequeueOperation.objects.create(
        created_by="ops", created_at=now, updated_at=now, next_at=now, total=3, state=state
    )
    out = io.StringIO()
    call_command("rmq_operations", f"--{verb}", str(op.pk), stdout=out)
    assert out.getvalue() == f"Operation #{op.pk}: {said}.\n"


def test_30_refusals_are_30_refused_and_never_sent_again(rmq):
    """Topic mode, routing keys no queue is bound to: the broker returns each copy."""
    rows = park_rows(rmq, [{"id": i} for i in range(40)])
    ParkedMessage.objects.filter(pk__in=[r.pk for r in rows[:30]]).update(
        routing_key="nobody.listens"
    )
    op = operations.create(ParkedMessage.objects.all(), user="ops", mode="topic")
    operations.advance(op.pk, owner="stepper")
    op.refresh_from_db()
    assert item_states(op) == Counter({ItemState.REFUSED: 30, ItemState.SENT: 10})
    assert (op.refused, op.sent) == (30, 10)
    RequeueOperation.objects.filter(pk=op.pk).update(next_at=op.created_at)
    operations.advance(op.pk, owner="stepper")
    op.refresh_from_db()
    assert (op.refused, op.sent) == (30, 10)
    assert rmq.depth(rmq.queue("alpha")) == 10


def test_a_step_longer_than_its_lease_keeps_it_and_no_other_process_steps(rmq, monkeypatch):
    park_rows(rmq, [{"id": i} for i in range(50)])
    op = operations.create(ParkedMessage.objects.all(), user="ops")
    others: list[Any] = []

    def lease_until() -> Any:
        return RequeueOperation.objects.values_list("lease_until", flat=True).get(pk=op.pk)

    def another_process_tries_meanwhile() -> None:
        seen = {lease_until()}

        def renewed_twice() -> bool:
            others.append(operations.advance(op.pk, owner="another"))
            seen.add(lease_until())
            return len(seen) >= 3

        waiting.until("the lease renewed twice while the step runs", renewed_twice)

    once_confirmed(monkeypatch, another_process_tries_meanwhile)
    with settings_with(OPERATION_LEASE_SECONDS=6):  # a renewal may be 4 s late
        assert operations.advance(op.pk, owner="stepper") is not None
    assert others and all(other is None for other in others)
    op.refresh_from_db()
    assert op.sent == 50 and op.lease_until is None
    assert rmq.depth(rmq.queue("alpha")) == 50
    assert set(ParkedMessage.objects.values_list("requeue_count", flat=True)) == {1}


def test_a_taker_sends_what_a_dead_step_never_published_and_counts_what_it_may_have(rmq):
    """A step died after fencing its batch: rows it never claimed never reached the broker
    and are sent by the process that takes over; rows it claimed may be out and count as
    sent, never sent again."""
    park_rows(rmq, [{"id": i} for i in range(30)])
    op = operations.create(ParkedMessage.objects.all(), user="ops")
    pks = list(ParkedMessage.objects.order_by("pk").values_list("pk", flat=True))
    never_published, maybe_out = pks[:10], pks[10:20]
    RequeueItem.objects.filter(operation=op, parked_id__in=pks[:20]).update(state=ItemState.SENDING)
    past = timezone.now() - timedelta(seconds=60)
    ParkedClaim.objects.bulk_create(
        ParkedClaim(parked_id=pk, token="dead-run", claimed_at=timezone.now()) for pk in maybe_out
    )
    RequeueOperation.objects.filter(pk=op.pk).update(lease_owner="dead:1", lease_until=past)
    with settings_with(BATCH_SIZE=10):
        assert operations.advance(op.pk, owner="taker") is not None
    op.refresh_from_db()
    assert op.sent == 20, op.state_reason  # 10 counted from the dead step, 10 sent now
    states = dict(RequeueItem.objects.filter(operation=op).values_list("parked_id", "state"))
    assert {states[pk] for pk in never_published + maybe_out} == {ItemState.SENT}
    assert {states[pk] for pk in pks[20:]} == {ItemState.PENDING}
    status = dict(ParkedMessage.objects.values_list("pk", "status"))
    assert {status[pk] for pk in never_published} == {ParkedStatus.REQUEUED}
    assert {status[pk] for pk in maybe_out} == {ParkedStatus.PARKED}  # left to its claim
    assert rmq.depth(rmq.queue("alpha")) == 10  # only the never-published ten went out


def test_a_step_reads_the_operation_not_a_count_of_its_items(rmq):
    park_rows(rmq, [{"id": i} for i in range(30)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", canary=5)
    table = RequeueItem._meta.db_table
    for _ in range(2):  # the canary, then its wait
        RequeueOperation.objects.filter(pk=op.pk).update(next_at=op.created_at)
        with CaptureQueriesContext(connection) as queries:
            operations.advance(op.pk, owner="stepper")
        counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and table in q["sql"]]
        assert counts == []
    op.refresh_from_db()
    assert (op.sent, op.state_reason) == (5, "Canary: waiting for 5 sent message(s) to be handled.")


def test_resume_after_a_canary_stop_sends_the_rest_once_each(rmq):
    """The operator's story: the canary stops at a failure, Resume sends the rest (the
    failure before the resume no longer counts; the canary starts again)."""
    bodies = [{"id": i} for i in range(30)]
    bodies[1] = {"id": 1, "fail": "always"}
    rows = park_rows(rmq, bodies)
    op = operations.create(ParkedMessage.objects.all(), user="ops", canary=3)
    op, _ = run_until_settled(rmq, op, timeout=120)
    assert (op.state, op.sent, op.failed_again) == (OperationState.STOPPED, 3, 1), op.state_reason
    assert "The canary failed" in op.state_reason
    assert operations.resume(op.pk, "ops")
    op, _ = run_until_settled(rmq, op, timeout=120)
    assert (op.state, op.sent, op.handled, op.failed_again) == (
        OperationState.DONE,
        30,
        29,
        1,
    ), op.state_reason
    assert op.unknown == 0
    assert handled_ids(rmq) == Counter(i for i in range(30) if i != 1)  # once each
    parked = ParkedMessage.objects.filter(status=ParkedStatus.PARKED)
    assert list(parked.values_list("pk", flat=True)) == [rows[1].pk]


def test_two_operations_over_the_same_rows_send_each_row_once(rmq):
    """Two operators start an operation over the same group; two consumers step both."""
    n = 300
    park_rows(rmq, [{"id": i} for i in range(n)])
    ops = [operations.create(ParkedMessage.objects.all(), user=who) for who in ("ann", "bob")]
    children = [start_consumer(rmq.prefix, rmq.log, "alpha") for _ in range(2)]
    try:
        waiting.until(
            "both operations finished",
            lambda: not RequeueOperation.objects.filter(state=OperationState.RUNNING).exists(),
            timeout=240,
        )
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.communicate(timeout=60)
    first, second = (RequeueOperation.objects.get(pk=op.pk) for op in ops)
    assert (first.state, second.state) == (OperationState.DONE, OperationState.DONE)
    assert (first.sent + second.sent, first.skipped + second.skipped) == (n, n)
    assert (first.handled + second.handled, first.unknown + second.unknown) == (n, 0)
    assert handled_ids(rmq) == Counter(range(n))  # each row once, whichever sent it


def test_a_resumed_operation_that_stops_again_names_the_new_failure(rmq):
    bodies = [{"id": i} for i in range(40)]
    bodies[1] = {"id": 1, "fail": "always"}
    bodies[20] = {"id": 20, "fail": "always"}
    rows = park_rows(rmq, bodies)
    op = operations.create(ParkedMessage.objects.all(), user="ops", canary=3)
    op, _ = run_until_settled(rmq, op, timeout=120)
    assert op.state == OperationState.STOPPED and f"#{rows[1].pk} failed" in op.state_reason
    assert operations.resume(op.pk, "ops")
    op, _ = run_until_settled(rmq, op, timeout=120)
    assert (op.state, op.failed_again) == (OperationState.STOPPED, 2), op.state_reason
    assert f"message #{rows[20].pk} failed again" in op.state_reason
