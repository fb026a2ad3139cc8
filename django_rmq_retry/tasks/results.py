"""The results table: a ``TaskResultRecord`` row per task, read back as a ``TaskResult``.

Rows are written only by a backend with results on. Each write is one short statement in
autocommit (or in the caller's transaction at enqueue, so an outbox-sent task and its row
commit together). Retention: a worker deletes rows untouched for longer than the
backend's retention at most once a minute.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from traceback import format_exception
from typing import Any

from django.db import router
from django.utils import timezone

from ..models import TaskResultRecord
from .api import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus
from .task_message import TaskMessage

# Statuses (named here: django-stubs types the enum's members as ``...``).
READY = TaskResultStatus("READY")
RUNNING = TaskResultStatus("RUNNING")
FAILED = TaskResultStatus("FAILED")
SUCCESSFUL = TaskResultStatus("SUCCESSFUL")
#: Ours, in the table only (Django's statuses have none): a cancelled task never runs
#: again, and reads back as FAILED with a ``TaskCancelled`` error (``as_result``).
CANCELLED = "CANCELLED"
#: The exception class path of that error.
CANCELLED_ERROR = "django_rmq_retry.tasks.cancel.TaskCancelled"

#: Seconds between two retention sweeps of one process.
SWEEP_EVERY = 60.0

_sweep_lock = threading.Lock()
_last_sweep = 0.0


def database() -> str:
    """The database alias the results table is written to."""
    return router.db_for_write(TaskResultRecord)


def write_enqueued(msg: TaskMessage) -> None:
    """The row of a task just enqueued (status READY)."""
    now = timezone.now()
    db = database()
    TaskResultRecord.objects.using(db).create(
        id=msg.result_id,
        backend=msg.backend,
        task_path=msg.task_path,
        queue_name=msg.queue_name,
        priority=msg.priority,
        status=READY,
        args=msg.args,
        kwargs=msg.kwargs,
        run_after=msg.run_after,
        enqueued_at=msg.enqueued_at,
        updated_at=now,
    )


def forget(result_id: str) -> None:
    """Delete the row of a task whose publish failed (it was never enqueued)."""
    TaskResultRecord.objects.using(database()).filter(id=result_id).delete()


def not_sent(result_id: str, exc: BaseException) -> None:
    """The task of a committed row could not be published after the commit: FAILED, with
    the publish error as its one error (no worker will ever run it)."""
    now = timezone.now()
    error = {
        "exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "traceback": "".join(format_exception(exc)),
    }
    TaskResultRecord.objects.using(database()).filter(id=result_id, status=READY).update(
        status=FAILED, finished_at=now, updated_at=now, errors=[error]
    )


def _update(msg: TaskMessage, change: Callable[[TaskResultRecord], None]) -> TaskResultRecord:
    """Read, change and save one row (created if a retention sweep, or a backend with
    results off at enqueue, left none).

    No transaction and no row lock: one task's row is written by one attempt at a time
    (a message is with one receiver at a time), so a read then a write cannot interleave
    with another writer of that row; and a read-then-write transaction is what SQLite
    refuses at once ("database is locked") when another thread writes meanwhile.
    """
    db = router.db_for_write(TaskResultRecord)
    record = TaskResultRecord.objects.using(db).filter(id=msg.result_id).first()
    if record is None:
        record = TaskResultRecord(
            id=msg.result_id,
            backend=msg.backend,
            task_path=msg.task_path,
            queue_name=msg.queue_name,
            priority=msg.priority,
            args=msg.args,
            kwargs=msg.kwargs,
            run_after=msg.run_after,
            enqueued_at=msg.enqueued_at,
        )
    change(record)
    record.updated_at = timezone.now()
    record.save(using=db)
    return record


def started(msg: TaskMessage, worker_id: str, at: datetime) -> TaskResultRecord | None:
    """An attempt starts: RUNNING (``None``: the task was cancelled, it must not run).

    The claim is one conditional ``UPDATE`` (not CANCELLED -> RUNNING) and a cancel is one
    (READY or FAILED -> CANCELLED), so exactly one of the two wins a race."""
    rows = TaskResultRecord.objects.using(database()).filter(id=msg.result_id)
    if not rows.exclude(status=CANCELLED).update(status=RUNNING, updated_at=at) and rows.exists():
        return None

    def change(r: TaskResultRecord) -> None:
        r.status = RUNNING
        r.started_at = r.started_at or at
        r.last_attempted_at = at
        r.worker_ids = [*r.worker_ids, worker_id]

    return _update(msg, change)


def finished(
    msg: TaskMessage,
    status: TaskResultStatus,
    at: datetime,
    *,
    return_value: Any = None,
    error: TaskError | None = None,
) -> TaskResultRecord:
    """An attempt ended: ``status`` READY (a retry follows), SUCCESSFUL or FAILED."""

    def change(r: TaskResultRecord) -> None:
        r.status = status
        if status != READY:
            r.finished_at = at
        if status == SUCCESSFUL:
            r.return_value = return_value
        if error is not None:
            r.errors = [
                *r.errors,
                {
                    "exception_class_path": error.exception_class_path,
                    "traceback": error.traceback,
                },
            ]

    return _update(msg, change)


def parked(result_id: str, at: datetime) -> bool:
    """The consumer parked the task (after its last attempt, or before running it: delivery
    limit, undecodable, refused retry copy): its result is FAILED. ``True`` if this call
    made it so (one conditional ``UPDATE``; a row already final stays as it is)."""
    changed = (
        TaskResultRecord.objects.using(database())
        .filter(id=result_id)
        .exclude(status__in=[FAILED, SUCCESSFUL, CANCELLED])
        .update(status=FAILED, finished_at=at, updated_at=at)
    )
    return changed == 1


def is_cancelled(result_id: str) -> bool:
    return (
        TaskResultRecord.objects.using(database()).filter(id=result_id, status=CANCELLED).exists()
    )


def cancel(result_id: str, backend: str) -> bool:
    """Cancel a task that has not started (deferred, waiting for a retry) or was parked:
    ``True`` if this call cancelled it (one conditional ``UPDATE``); a task running or
    finished otherwise is left as it is."""
    now = timezone.now()
    changed = (
        TaskResultRecord.objects.using(database())
        .filter(id=result_id, backend=backend, status__in=[READY, FAILED])
        .update(status=CANCELLED, finished_at=now, updated_at=now)
    )
    return changed == 1


def as_result(record: TaskResultRecord, task: Task) -> TaskResult:
    cancelled = record.status == CANCELLED
    errors = [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in record.errors
    ]
    if cancelled:
        errors.append(TaskError(exception_class_path=CANCELLED_ERROR, traceback="cancelled"))
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=record.id,
        status=FAILED if cancelled else TaskResultStatus(record.status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=record.backend,
        errors=errors,
        worker_ids=list(record.worker_ids),
    )
    object.__setattr__(result, "_return_value", record.return_value)
    return result


def get(result_id: str, backend: str) -> TaskResultRecord:
    try:
        return TaskResultRecord.objects.get(id=result_id, backend=backend)
    except TaskResultRecord.DoesNotExist:
        raise TaskResultDoesNotExist(result_id) from None


def sweep(retention: timedelta, *, clock: Callable[[], float] = time.monotonic) -> int:
    """Delete finished rows untouched for longer than ``retention``, at most once per
    ``SWEEP_EVERY`` seconds per process (0 when it is not time yet or another thread
    sweeps). A task still waiting (deferred for longer than the retention) keeps its row."""
    global _last_sweep
    now = clock()
    if now - _last_sweep < SWEEP_EVERY or not _sweep_lock.acquire(blocking=False):
        return 0
    try:
        _last_sweep = now
        cutoff = timezone.now() - retention
        deleted, _ = TaskResultRecord.objects.filter(
            updated_at__lt=cutoff,
            status__in=[SUCCESSFUL, FAILED, CANCELLED],
        ).delete()
        return deleted
    finally:
        _sweep_lock.release()
