"""A background requeue operation outlives the process stepping it: killed between the
broker's confirms and its marks, or after fencing a batch and before publishing it, the
operation is taken over by a consumer once the lease runs out, finishes, and sends no row
twice; copies whose outcome never comes end the wait after ``OPERATION_OUTCOME_TIMEOUT``.

The children run ``tests/faults/op_settings.py``: a 3 s lease, so a takeover takes seconds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter

import pytest

from django_rmq_retry.models import (
    ItemState,
    OperationState,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from django_rmq_retry.parking import operations
from tests import waiting
from tests.conftest import ROOT, Child, start_consumer, subprocess_env
from tests.test_operations import handled_ids, park_rows

pytestmark = [pytest.mark.faults, pytest.mark.broker, pytest.mark.django_db(transaction=True)]

N = 100
BATCH = 20


def child_env(rmq, **extra: str) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "tests.faults.op_settings",
        "RMQ_OPERATION_LEASE": "3",
        "RMQ_BATCH_SIZE": str(BATCH),
        **extra,
    }


def kill_the_stepper(rmq, op: RequeueOperation, when: str) -> None:
    env = subprocess_env(rmq.prefix, rmq.log, **child_env(rmq))
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "faults" / "op_stepper.py"), str(op.pk), when],
        cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=waiting.DEADLINE,
    )  # fmt: skip
    assert done.returncode == 9, done.stdout + done.stderr
    states = Counter(RequeueItem.objects.filter(operation=op).values_list("state", flat=True))
    assert states == Counter({ItemState.SENDING: BATCH, ItemState.PENDING: N - BATCH})
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == N


def finish_with_a_consumer(rmq, op: RequeueOperation, **extra: str) -> RequeueOperation:
    child = start_consumer(rmq.prefix, rmq.log, "alpha", **child_env(rmq, **extra))
    try:
        waiting.until(
            "the operation finished",
            lambda: RequeueOperation.objects.get(pk=op.pk).state != OperationState.RUNNING,
            child=child,
            timeout=240,
        )
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)
    op.refresh_from_db()
    return op


def test_a_stepper_killed_between_confirms_and_marks_sends_no_row_twice(rmq):
    park_rows(rmq, [{"id": i} for i in range(N)])
    op = operations.create(ParkedMessage.objects.all(), user="ops")
    kill_the_stepper(rmq, op, "confirmed")
    assert rmq.depth(rmq.queue("alpha")) == BATCH  # out, unmarked, uncounted
    op = finish_with_a_consumer(rmq, op)
    assert (op.state, op.sent, op.handled, op.unknown) == (OperationState.DONE, N, N, 0), (
        op.state_reason
    )
    assert handled_ids(rmq) == Counter(range(N))  # every message once
    rows = ParkedMessage.objects.all()
    assert set(rows.values_list("status", "requeue_count")) == {(ParkedStatus.REQUEUED, 1)}


def test_a_stepper_killed_before_publishing_never_leaves_the_operation_waiting(rmq):
    park_rows(rmq, [{"id": i} for i in range(N)])
    op = operations.create(ParkedMessage.objects.all(), user="ops")
    kill_the_stepper(rmq, op, "fenced")
    assert rmq.depth(rmq.queue("alpha")) == 0
    op = finish_with_a_consumer(rmq, op, RMQ_OPERATION_OUTCOME_TIMEOUT="10")
    # The fenced batch may have gone out: never sent again; its outcome never came.
    assert (op.state, op.sent, op.handled, op.unknown) == (
        OperationState.DONE,
        N,
        N - BATCH,
        BATCH,
    ), op.state_reason
    assert f"{BATCH} without a reported outcome" in op.state_reason
    assert handled_ids(rmq) == Counter(range(BATCH, N))
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == BATCH


def start_stepper(rmq, name: str, **extra: str) -> Child:
    """``manage.py rmq_operations``: a process that only steps operations."""
    return Child(
        [sys.executable, str(ROOT / "manage.py"), "rmq_operations"],
        subprocess_env(rmq.prefix, rmq.log, **child_env(rmq, **extra)),
        rmq.log.with_name(f"{name}.out"),
    )


def test_rmq_operations_killed_mid_operation_is_taken_over_and_sends_no_row_twice(rmq):
    """SIGKILL wherever the stepping process is (mid-publish, between confirm and marks,
    between steps); a consumer that steps nothing handles the copies meanwhile."""
    n = 200
    park_rows(rmq, [{"id": i} for i in range(n)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", rate=50.0)
    timeout = {"RMQ_OPERATION_OUTCOME_TIMEOUT": "10"}
    consumer = start_consumer(rmq.prefix, rmq.log, "alpha", "--no-relay", **child_env(rmq))
    try:
        stepper = start_stepper(rmq, "stepper", **timeout)
        waiting.until(
            "the first process sent some",
            lambda: RequeueOperation.objects.get(pk=op.pk).sent > 0,
            child=stepper,
        )
        stepper.kill()
        stepper.communicate(timeout=60)
        taker = start_stepper(rmq, "taker", **timeout)
        try:
            waiting.until(
                "the operation finished",
                lambda: RequeueOperation.objects.get(pk=op.pk).state != OperationState.RUNNING,
                child=taker,
                timeout=240,
            )
        finally:
            taker.send_signal(signal.SIGTERM)
            taker.communicate(timeout=60)
    finally:
        consumer.send_signal(signal.SIGTERM)
        consumer.communicate(timeout=60)
    op.refresh_from_db()
    handled = handled_ids(rmq)
    assert op.state == OperationState.DONE, op.state_reason
    assert set(handled.values()) == {1}  # no message twice
    # Every row's copy was handled, or never left the killed process (its row is parked,
    # counted "outcome unknown"): none lost, none waited for for ever.
    assert (op.sent, op.handled, op.handled + op.unknown) == (n, len(handled), n)
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == op.unknown


def test_a_stepper_frozen_past_its_lease_writes_nothing_after_the_takeover(rmq):
    """SIGSTOP the process holding the lease until another holds it, then SIGCONT: the
    woken step may finish publishing the batch it had fenced (the taker never sends those
    rows), but writes nothing more to the operation."""
    n = 200
    park_rows(rmq, [{"id": i} for i in range(n)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", rate=50.0)
    timeout = {"RMQ_OPERATION_OUTCOME_TIMEOUT": "10"}
    consumer = start_consumer(rmq.prefix, rmq.log, "alpha", "--no-relay", **child_env(rmq))
    frozen = start_stepper(rmq, "frozen", **timeout)
    taker = None
    try:
        waiting.until(
            "the first process sent some",
            lambda: RequeueOperation.objects.get(pk=op.pk).sent > 0,
            child=frozen,
        )
        frozen.send_signal(signal.SIGSTOP)
        owner = f":{frozen.pid}:"
        taker = start_stepper(rmq, "taker", **timeout)
        waiting.until(
            "another process took the lease over",
            lambda: owner not in RequeueOperation.objects.get(pk=op.pk).lease_owner,
            child=taker,
        )
        frozen.send_signal(signal.SIGCONT)
        waiting.until(
            "the operation finished",
            lambda: RequeueOperation.objects.get(pk=op.pk).state != OperationState.RUNNING,
            child=taker,
            timeout=240,
        )
    finally:
        frozen.send_signal(signal.SIGCONT)
        for child in (frozen, taker, consumer):
            if child is not None:
                child.send_signal(signal.SIGTERM)
        for child in (frozen, taker, consumer):
            if child is not None:
                child.communicate(timeout=60)
    op.refresh_from_db()
    handled = handled_ids(rmq)
    assert (op.state, op.state_changed_by) == (OperationState.DONE, ""), op.state_reason
    assert set(handled.values()) == {1}  # no message twice
    assert (op.sent, op.handled, op.handled + op.unknown) == (n, len(handled), n)
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == op.unknown


def test_a_step_frozen_between_confirms_and_marks_is_taken_over_and_writes_nothing(rmq):
    """The step stops itself once the broker confirmed its batch; a consumer takes the
    operation over after the lease; the woken step marks its rows but writes nothing to
    the operation, and no row is sent twice."""
    park_rows(rmq, [{"id": i} for i in range(N)])
    op = operations.create(ParkedMessage.objects.all(), user="ops")
    stepper = Child(
        [sys.executable, str(ROOT / "tests" / "faults" / "op_stepper.py"), str(op.pk), "freeze"],
        subprocess_env(rmq.prefix, rmq.log, **child_env(rmq)),
        rmq.log.with_name("frozen.out"),
    )
    consumer = None
    try:
        waiting.until("the step froze", lambda: "freezing" in stepper.output(), child=stepper)
        consumer = start_consumer(rmq.prefix, rmq.log, "alpha", **child_env(rmq))
        waiting.until(
            "a consumer took the lease over",
            lambda: not RequeueOperation.objects.get(pk=op.pk).lease_owner.startswith("stepper"),
            child=consumer,
        )
        stepper.send_signal(signal.SIGCONT)
        assert stepper.wait(timeout=60) == 0, stepper.output()
        waiting.until(
            "the operation finished",
            lambda: RequeueOperation.objects.get(pk=op.pk).state != OperationState.RUNNING,
            child=consumer,
            timeout=240,
        )
    finally:
        stepper.send_signal(signal.SIGCONT)
        stepper.communicate(timeout=60)
        if consumer is not None:
            consumer.send_signal(signal.SIGTERM)
            consumer.communicate(timeout=60)
    op.refresh_from_db()
    assert (op.state, op.sent, op.handled, op.unknown) == (OperationState.DONE, N, N, 0), (
        op.state_reason
    )
    assert handled_ids(rmq) == Counter(range(N))  # every message once
    rows = ParkedMessage.objects.all()
    assert set(rows.values_list("status", "requeue_count")) == {(ParkedStatus.REQUEUED, 1)}
