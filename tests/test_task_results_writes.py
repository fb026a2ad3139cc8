"""The result row's writes at an attempt's start and end, on the database the suite runs on
(SQLite, or PostgreSQL through ``DATABASE_URL``): the lists the database appends to keep
one entry per attempt in order, the first start stays, and a cancel racing a start ends in
exactly one of the two.
"""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from django_rmq_retry.registry.task_api import task_api_module

pytestmark = pytest.mark.skipif(
    task_api_module() is None,
    reason="Django < 6.0 without the django-tasks backport (pip install django-tasks)",
)

if task_api_module() is not None:
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from django_rmq_retry.models import TaskResultRecord
    from django_rmq_retry.tasks import results
    from django_rmq_retry.tasks.api import TaskError, TaskResultStatus, task_started
    from django_rmq_retry.tasks.task_message import TaskMessage
    from tests.tasksproject import tasks as t


def message(result_id: str | None = None) -> TaskMessage:
    return TaskMessage(
        result_id=result_id or uuid.uuid4().hex,
        task_path="tests.tasksproject.tasks.add",
        backend="default",
        queue_name="default",
        priority=0,
        args=[1, 2],
        kwargs={},
        takes_context=False,
        run_after=None,
        enqueued_at=timezone.now(),
    )


def error(n: int) -> TaskError:
    return TaskError(exception_class_path="builtins.ValueError", traceback=f"attempt {n}")


@pytest.mark.django_db(transaction=True)
def test_three_attempts_append_in_order_and_keep_the_first_start():
    msg = message()
    results.write_enqueued(msg)
    first = timezone.now()
    times = [first, first + timedelta(seconds=1), first + timedelta(seconds=2)]
    seen = []
    for n, at in enumerate(times, start=1):
        record = results.started(msg, f"worker-{n}", at)
        assert record is not None
        # What the attempt is given (TaskContext.attempt counts worker ids).
        seen.append((record.worker_ids, record.started_at, record.last_attempted_at))
        if n < 3:
            results.finished(msg, results.READY, at, error=error(n))
    results.finished(msg, results.SUCCESSFUL, times[2], return_value={"n": [3]})

    assert seen == [
        (["worker-1"], first, times[0]),
        (["worker-1", "worker-2"], first, times[1]),
        (["worker-1", "worker-2", "worker-3"], first, times[2]),
    ]
    row = TaskResultRecord.objects.get(id=msg.result_id)
    assert row.status == results.SUCCESSFUL
    assert row.worker_ids == ["worker-1", "worker-2", "worker-3"]
    assert row.errors == [
        {"exception_class_path": "builtins.ValueError", "traceback": "attempt 1"},
        {"exception_class_path": "builtins.ValueError", "traceback": "attempt 2"},
    ]
    assert (row.started_at, row.last_attempted_at, row.finished_at) == (first, times[2], times[2])
    assert row.return_value == {"n": [3]}
    assert row.updated_at == times[2]


@pytest.mark.django_db(transaction=True)
def test_a_row_missing_at_start_or_end_is_created():
    at = timezone.now()
    starts, ends = message(), message()
    record = results.started(starts, "worker-1", at)
    assert record is not None and record.worker_ids == ["worker-1"]
    results.finished(ends, results.READY, at, error=error(1))

    started = TaskResultRecord.objects.get(id=starts.result_id)
    assert (started.status, started.started_at, started.args) == (results.RUNNING, at, [1, 2])
    ended = TaskResultRecord.objects.get(id=ends.result_id)
    assert (ended.status, ended.finished_at, len(ended.errors)) == (results.READY, None, 1)


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_task_is_not_started_and_stays_cancelled():
    msg = message()
    results.write_enqueued(msg)
    assert results.cancel(msg.result_id, "default")
    assert results.started(msg, "worker-1", timezone.now()) is None
    row = TaskResultRecord.objects.get(id=msg.result_id)
    assert (row.status, row.worker_ids, row.started_at) == (results.CANCELLED, [], None)


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_a_start_ends_in_exactly_one_of_the_two():
    """Each round, a start and a cancel of one READY row at once, on two connections."""
    won: dict[str, int] = {"started": 0, "cancelled": 0}
    for _ in range(25):
        msg = message()
        results.write_enqueued(msg)
        gate = threading.Barrier(2)
        out: dict[str, Any] = {}

        def start(msg: TaskMessage = msg, gate: threading.Barrier = gate, out=out) -> None:
            gate.wait()
            try:
                out["started"] = results.started(msg, "worker-1", timezone.now())
            finally:
                connection.close()

        def cancel(msg: TaskMessage = msg, gate: threading.Barrier = gate, out=out) -> None:
            gate.wait()
            try:
                out["cancelled"] = results.cancel(msg.result_id, "default")
            finally:
                connection.close()

        threads = [threading.Thread(target=start), threading.Thread(target=cancel)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert set(out) == {"started", "cancelled"}
        row = TaskResultRecord.objects.get(id=msg.result_id)
        if out["started"] is not None:
            assert not out["cancelled"]
            assert (row.status, row.worker_ids) == (results.RUNNING, ["worker-1"])
            won["started"] += 1
        else:
            assert out["cancelled"]
            assert (row.status, row.worker_ids) == (results.CANCELLED, [])
            won["cancelled"] += 1
    assert sum(won.values()) == 25


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_retried_twice_then_successful(rmq):
    """Through a consumer: the attempts' own start times (``task_started``) against the row."""
    starts: list[tuple[datetime, int]] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        starts.append((task_result.last_attempted_at, len(task_result.worker_ids)))

    call_command("rmq_consume", setup_only=True, verbosity=0)
    result = t.flaky_task.enqueue(succeed_on=3)
    task_started.connect(on_started)
    try:
        call_command(
            "rmq_consume",
            "tasks.default.tests.tasksproject.tasks.flaky_task",
            max_messages=3,
            max_idle_time=10,
            verbosity=0,
        )
    finally:
        task_started.disconnect(on_started)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["attempt"] == 3
    assert [n for _at, n in starts] == [1, 2, 3]
    assert len(result.worker_ids) == 3
    assert [e.traceback.splitlines()[-1] for e in result.errors] == [
        "RuntimeError: attempt 1 fails",
        "RuntimeError: attempt 2 fails",
    ]
    assert result.started_at == starts[0][0]
    assert result.last_attempted_at == starts[2][0]
    assert result.finished_at is not None and result.finished_at >= starts[2][0]
