"""The results table: a ``TaskResultRecord`` row per task, read back as a ``TaskResult``.

Rows are written only by a backend with results on. Each write is one short statement in
autocommit (or in the caller's transaction at enqueue, so an outbox-sent task and its row
commit together). An attempt's start and end are one ``UPDATE`` each on PostgreSQL and
SQLite (the JSON lists appended to by the database, the start's row read back through
``RETURNING``): the task thread spends most of its time on these writes, and each extra
statement is a round trip and each extra commit a flush. Other databases read, change and
save the row. Retention: a worker deletes rows untouched for longer than the backend's
retention at most once a minute.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from traceback import format_exception
from typing import Any

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
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
    results off at enqueue, left none), on a database that cannot append in SQL.

    No transaction and no row lock: one task's row is written by one attempt at a time
    (a message is with one receiver at a time), so a read then a write cannot interleave
    with another writer of that row; and a read-then-write transaction is what SQLite
    refuses at once ("database is locked") when another thread writes meanwhile.
    """
    db = router.db_for_write(TaskResultRecord)
    record = TaskResultRecord.objects.using(db).filter(id=msg.result_id).first()
    if record is None:
        record = _fresh(msg)
    change(record)
    record.updated_at = timezone.now()
    record.save(using=db)
    return record


def _appends_in_sql(connection: BaseDatabaseWrapper) -> bool:
    """Whether this database appends to a JSON list in an ``UPDATE`` and returns the row
    from it (PostgreSQL; SQLite from 3.35, the release that brought ``RETURNING``)."""
    return connection.vendor in ("postgresql", "sqlite") and bool(
        connection.features.can_return_columns_from_insert
    )


def _append(connection: BaseDatabaseWrapper, column: str) -> str:
    """SQL for ``column`` (a JSON list) with one item appended, the item's JSON text as
    the one parameter: ``jsonb ||`` on PostgreSQL, ``json_insert`` at ``$[#]`` (the end of
    the array) on SQLite, where a JSON column is text."""
    col = _column(connection, column)
    if connection.vendor == "postgresql":
        return f"{col} = {col} || jsonb_build_array(%s::jsonb)"
    return f"{col} = json_insert({col}, '$[#]', json(%s))"


def _field(name: str) -> Any:
    return TaskResultRecord._meta.get_field(name)


def _column(connection: BaseDatabaseWrapper, name: str) -> str:
    """The quoted column of the field ``name``."""
    return str(connection.ops.quote_name(_field(name).column))


def _datetime(value: datetime, connection: BaseDatabaseWrapper) -> Any:
    return _field("updated_at").get_db_prep_value(value, connection)


def _fresh(msg: TaskMessage, **values: Any) -> TaskResultRecord:
    """A row for a task that has none (a retention sweep, or a backend with results off at
    enqueue, left none), from what its message says, with ``values``; not saved."""
    return TaskResultRecord(
        id=msg.result_id,
        backend=msg.backend,
        task_path=msg.task_path,
        queue_name=msg.queue_name,
        priority=msg.priority,
        args=msg.args,
        kwargs=msg.kwargs,
        run_after=msg.run_after,
        enqueued_at=msg.enqueued_at,
        **values,
    )


def _created(msg: TaskMessage, db: str, **values: Any) -> TaskResultRecord:
    """:func:`_fresh`, saved."""
    record = _fresh(msg, **values)
    record.save(using=db)
    return record


def started(msg: TaskMessage, worker_id: str, at: datetime) -> TaskResultRecord | None:
    """An attempt starts: RUNNING, the row as it now is (``None``: the task was cancelled,
    it must not run).

    The claim is one conditional ``UPDATE`` (not CANCELLED -> RUNNING) and a cancel is one
    (READY or FAILED -> CANCELLED): the database runs the two one after the other on the
    row (a row lock, or SQLite's one writer) and each tests the status the other left, so
    exactly one of the two wins a race. Where the claim also sets the start's columns and
    returns the row, that one statement is the whole write; a ``SELECT`` follows only when
    it changed nothing, to tell a cancelled task from a task without a row (created)."""
    db = database()
    connection = connections[db]
    if not _appends_in_sql(connection):
        return _started_in_python(msg, worker_id, at, db)
    q = connection.ops.quote_name

    def c(name: str) -> str:
        return _column(connection, name)

    at_db = _datetime(at, connection)
    sql = (
        f"UPDATE {q(TaskResultRecord._meta.db_table)} SET {c('status')} = %s, "
        f"{c('started_at')} = COALESCE({c('started_at')}, %s), "
        f"{c('last_attempted_at')} = %s, {c('updated_at')} = %s, "
        f"{_append(connection, 'worker_ids')} "
        f"WHERE {c('id')} = %s AND {c('status')} <> %s RETURNING *"
    )
    params = [str(RUNNING), at_db, at_db, at_db, json.dumps(worker_id), msg.result_id, CANCELLED]
    claimed = list(TaskResultRecord.objects.using(db).raw(sql, params))
    if claimed:
        return claimed[0]
    if TaskResultRecord.objects.using(db).filter(id=msg.result_id).exists():
        return None
    return _created(
        msg,
        db,
        status=RUNNING,
        started_at=at,
        last_attempted_at=at,
        worker_ids=[worker_id],
        updated_at=at,
    )


def _started_in_python(
    msg: TaskMessage, worker_id: str, at: datetime, db: str
) -> TaskResultRecord | None:
    """``started`` where the database cannot append in SQL: the same claim, then the row
    read, changed and saved."""
    rows = TaskResultRecord.objects.using(db).filter(id=msg.result_id)
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
) -> None:
    """An attempt ended: ``status`` READY (a retry follows), SUCCESSFUL or FAILED. One
    ``UPDATE`` where the database appends the error itself; a row is created only if it
    has none."""
    entry = (
        None
        if error is None
        else {"exception_class_path": error.exception_class_path, "traceback": error.traceback}
    )
    db = database()
    connection = connections[db]
    if not _appends_in_sql(connection):
        _finished_in_python(msg, status, at, return_value, entry)
        return
    q = connection.ops.quote_name

    def c(name: str) -> str:
        return _column(connection, name)

    at_db = _datetime(at, connection)
    sets = [f"{c('status')} = %s", f"{c('updated_at')} = %s"]
    params: list[Any] = [str(status), at_db]
    if status != READY:
        sets.append(f"{c('finished_at')} = %s")
        params.append(at_db)
    if status == SUCCESSFUL:
        sets.append(f"{c('return_value')} = %s")
        params.append(_field("return_value").get_db_prep_save(return_value, connection))
    if entry is not None:
        sets.append(_append(connection, "errors"))
        params.append(json.dumps(entry))
    sql = f"UPDATE {q(TaskResultRecord._meta.db_table)} SET {', '.join(sets)} WHERE {c('id')} = %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, msg.result_id])
        if cursor.rowcount:
            return
    _created(
        msg,
        db,
        status=status,
        finished_at=None if status == READY else at,
        return_value=return_value if status == SUCCESSFUL else None,
        errors=[] if entry is None else [entry],
        updated_at=at,
    )


def _finished_in_python(
    msg: TaskMessage,
    status: TaskResultStatus,
    at: datetime,
    return_value: Any,
    entry: dict[str, str] | None,
) -> None:
    """``finished`` where the database cannot append in SQL: read, change, save."""

    def change(r: TaskResultRecord) -> None:
        r.status = status
        if status != READY:
            r.finished_at = at
        if status == SUCCESSFUL:
            r.return_value = return_value
        if entry is not None:
            r.errors = [*r.errors, entry]

    _update(msg, change)


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
