"""A parked task's result: FAILED, and ``task_finished``, once the consumer's park is durable.

The consumer alone decides whether a failed attempt is retried or parked (and it parks for
causes the task never saw: the delivery limit, a retry copy the broker refused, a body it
cannot read). So the result follows that decision, not a guess of it: the ``message_parked``
signal (sent once the parked row is committed) makes the task's result FAILED in one
conditional ``UPDATE`` and sends Django's ``task_finished`` when that update won.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from ..signals import message_parked
from . import results
from .api import Task, TaskError, TaskResult, task_backends, task_finished
from .results import FAILED
from .task_message import KIND, TaskMessage

logger = logging.getLogger("django_rmq_retry.tasks")


def on_task_parked(sender: Any, parked: Any, reason: str, created: bool, **kwargs: Any) -> None:
    """``message_parked`` receiver: act on our tasks' rows only (receiver ``tasks.…``)."""
    if not str(sender).startswith(KIND + "."):
        return
    try:
        msg = TaskMessage.from_body(json.loads(bytes(parked.body)))
        backend = task_backends[msg.backend]
    except Exception:  # not a task message we can read: the parked row says why
        return
    keep = bool(getattr(backend, "results", False))
    now = timezone.now()
    if keep:
        if not results.parked(msg.result_id, now):
            return  # already final (a redelivered park, a task that had succeeded)
        record = results.get(msg.result_id, msg.backend)
        task = _task(msg)
        if task is None:
            return
        result = results.as_result(record, task)
    else:
        if not created:
            return
        task = _task(msg)
        if task is None:
            return
        result = _result_without_row(msg, task, parked, now)
    task_finished.send(type(backend), task_result=result)


def _task(msg: TaskMessage) -> Task | None:
    try:
        task = import_string(msg.task_path)
    except ImportError:
        logger.warning("parked task %s: %s cannot be imported", msg.result_id, msg.task_path)
        return None
    if not isinstance(task, Task):
        return None
    return task.using(queue_name=msg.queue_name, priority=msg.priority, run_after=msg.run_after)


def _result_without_row(msg: TaskMessage, task: Task, parked: Any, now: Any) -> TaskResult:
    """A backend without results: what the parked row and the message say."""
    errors = []
    if parked.error_type:
        errors.append(TaskError(exception_class_path=parked.error_type, traceback=parked.traceback))
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=msg.result_id,
        status=FAILED,
        enqueued_at=msg.enqueued_at,
        started_at=None,
        finished_at=now,
        last_attempted_at=None,
        args=msg.args,
        kwargs=msg.kwargs,
        backend=msg.backend,
        errors=errors,
        worker_ids=[],
    )
    return result


def connect() -> None:
    """Listen to parks (idempotent: one receiver, held strongly)."""
    message_parked.connect(on_task_parked, weak=False, dispatch_uid="django_rmq_retry.tasks.parked")
