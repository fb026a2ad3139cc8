"""``TaskRunner``: the receiver that runs one task message.

The consumer hands it a delivery like any receiver's; what it raises goes through the same
decision (retry through the delay levels, or park) as any receiver's, and that decision is
the only one: the runner never guesses it. Around the task it writes the result row (when
the backend keeps results) and sends Django's ``task_started`` signal, and
``task_finished`` when the task succeeded; a task the consumer parks gets its FAILED and its
``task_finished`` from ``parked`` once the parked row is committed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from traceback import format_exception
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import app_settings, current_levels, current_names
from ..core.delays import epoch_us
from ..core.errors import Reject
from ..core.message import Message
from ..core.unit_threads import db_executor
from ..registry import Receiver
from . import backoff, results
from .api import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .defer import publish_deferred
from .results import READY, RUNNING, SUCCESSFUL
from .task_message import TaskMessage

logger = logging.getLogger("django_rmq_retry.tasks")

_runners: dict[str, Callable[..., Any]] = {}
_runners_lock = threading.Lock()


def worker_id() -> str:
    """This process, as ``TaskResult.worker_ids`` names it (host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def runner_for(queue_name: str, task_path: str, *, is_async: bool = False) -> Callable[..., Any]:
    """The one runner of a (queue name, task path): the registry keeps a receiver per
    function object, so a task validated again (``.using(...)``) must find the same one."""
    key = f"{queue_name}.{task_path}"
    with _runners_lock:
        runner = _runners.get(key)
        if runner is None:
            sync = TaskRunner(queue_name, task_path)
            runner = _runners[key] = async_runner(sync) if is_async else sync
        return runner


class TaskRunner:
    """A receiver named ``tasks.<queue_name>.<task path>`` (its queue and routing key)."""

    def __init__(self, queue_name: str, task_path: str) -> None:
        self.queue_name = queue_name
        self.task_path = task_path
        # ``registry.dotted_path`` names a receiver ``<__module__>.<__qualname__>``.
        self.__module__ = "tasks"
        self.__qualname__ = f"{queue_name}.{task_path}"

    def __repr__(self) -> str:
        return f"TaskRunner({self.queue_name!r}, {self.task_path!r})"

    def __call__(self, message: Message, *, receiver: Receiver, **kwargs: Any) -> None:
        loaded = self.load(message)
        if loaded is not None:
            backend, task, msg = loaded
            wait = still_to_wait(msg)
            if wait:  # no sleep(0): it only hands the GIL round, and the database calls do
                time.sleep(wait)
            run(backend, task, msg, message.attempt, receiver)

    def load(self, message: Message) -> tuple[Any, Task, TaskMessage] | None:
        """The backend, task and message to run (``None``: sent on to its ``run_after``)."""
        try:
            msg = TaskMessage.from_body(message.body)
            backend = task_backends[msg.backend]
        except Exception as exc:  # nothing to retry: park it for an operator to read
            raise Reject(f"not a task message this project can run: {exc}") from exc
        start_us = _round_start(message.headers)
        if msg.run_after is not None and epoch_us(msg.run_after) > start_us:
            if getattr(backend, "results", False) and results.is_cancelled(msg.result_id):
                return None  # cancelled while it waited: no more rounds
            # Sent through the outbox (to the work exchange), or deferred for longer than
            # the delay levels hold: round the levels again, acked once confirmed.
            publish_deferred(
                f"tasks.{msg.queue_name}.{msg.task_path}",
                message.raw,
                {},
                epoch_us(msg.run_after),
                now_us=start_us,
                base=dict(message.properties),
            )
            return None
        try:
            task = _task(msg)
        except Exception as exc:
            raise Reject(f"task {msg.task_path} cannot be loaded: {exc}") from exc
        return backend, task, msg


def async_runner(runner: TaskRunner) -> Callable[..., Any]:
    """The receiver of an ``async def`` task: an ``async def`` function (so every Python
    the package supports sees a coroutine function, and the consumer awaits it on its event
    loop, ``consumer.aio``), named as ``runner`` is; the result row and the signals are
    written as synchronous units through ``sync_to_async``."""

    async def run_async(message: Message, *, receiver: Receiver, **kwargs: Any) -> None:
        loaded = await _sync(runner.load)(message)
        if loaded is None:
            return
        backend, task, msg = loaded
        await asyncio.sleep(still_to_wait(msg))
        begun = await _sync(begin)(backend, task, msg, message.attempt)
        if begun is None:
            return
        result, keep = begun
        try:
            value = normalize_json(await task.acall(*_call_args(task, result, msg), **msg.kwargs))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            await _sync(_failed)(msg, result, exc, keep)
            instead = backoff.chosen(task, backend, receiver, exc, result)
            if instead is not None:
                raise instead from exc
            raise
        await _sync(_succeeded)(backend, result, msg, value, keep)

    run_async.__module__ = runner.__module__
    run_async.__qualname__ = runner.__qualname__
    run_async.__name__ = runner.task_path.rpartition(".")[2]
    return run_async


def _sync(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as one synchronous database unit for the event loop, with stale connections
    closed around it (as the consumer does around every delivery), on the consumer's
    database threads (``core.unit_threads``)."""

    def unit(*args: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    executor = db_executor.get()
    if executor is None:
        # In a thread (the in-memory broker, a test): that thread, its transaction; its
        # connections are its owner's to close.
        return sync_to_async(fn, thread_sensitive=True)
    # asgiref only needs an Executor's submit(); its hints name ThreadPoolExecutor.
    return sync_to_async(unit, thread_sensitive=False, executor=cast(ThreadPoolExecutor, executor))


def _round_start(headers: dict[str, Any]) -> int:
    """When the round a task arrives from ended, in epoch microseconds: the due time the
    delay levels were asked to hold it to (its due header), so that no clock but the
    publisher's decides whether it goes round again, and a consumer's clock (or the
    in-memory broker's virtual one) never sends it round for ever. A task without a due
    header came straight from the work exchange (through the outbox): now."""
    due_us = headers.get(current_names().header("due-us"))
    if isinstance(due_us, int) and not isinstance(due_us, bool):
        return due_us
    return epoch_us(timezone.now())


def still_to_wait(msg: TaskMessage) -> float:
    """Seconds between now and a ``run_after`` a hair ahead by this process's clock: the
    task waits them out so it never starts early. At most the landing and one resolution
    unit (what the consumer's own landing hold may leave): a ``run_after`` further ahead
    than that by this clock means another clock (the publisher's, the in-memory broker's
    virtual one), and the due time the message carries has decided."""
    if msg.run_after is None:
        return 0.0
    left = (msg.run_after - timezone.now()).total_seconds()
    most = (int(app_settings.DELAY_LANDING_MS) + current_levels().resolution_ms) / 1000
    return left if 0 < left <= most else 0.0


def _task(msg: TaskMessage) -> Task:
    task = import_string(msg.task_path)
    if not isinstance(task, Task):
        raise TypeError(f"{msg.task_path} is not a task (decorate it with @task)")
    return task.using(queue_name=msg.queue_name, priority=msg.priority, run_after=msg.run_after)


def run(backend: Any, task: Task, msg: TaskMessage, attempt: int, receiver: Receiver) -> None:
    """One attempt of ``task``: result row and signals around it; re-raises its error."""
    begun = begin(backend, task, msg, attempt)
    if begun is None:
        return
    result, keep = begun
    try:
        value = normalize_json(task.call(*_call_args(task, result, msg), **msg.kwargs))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _failed(msg, result, exc, keep)
        instead = backoff.chosen(task, backend, receiver, exc, result)
        if instead is not None:
            raise instead from exc
        raise
    _succeeded(backend, result, msg, value, keep)


def _call_args(task: Task, result: TaskResult[Any, Any], msg: TaskMessage) -> list[Any]:
    if task.takes_context:
        return [TaskContext(task_result=result), *msg.args]
    return list(msg.args)


def begin(
    backend: Any, task: Task, msg: TaskMessage, attempt: int
) -> tuple[TaskResult[Any, Any], bool] | None:
    """An attempt starts: its result row (when kept) and ``task_started`` (``None``: the
    task was cancelled; its delivery is acked without running it)."""
    keep = bool(getattr(backend, "results", False))
    me = worker_id()
    started_at = timezone.now()
    if keep:
        record = results.started(msg, me, started_at)
        if record is None:
            logger.info("task %s was cancelled: not run", msg.result_id)
            return None
        worker_ids = list(record.worker_ids)
        first_start = record.started_at
        errors = [
            TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
            for e in record.errors
        ]
    else:  # no row: the message's attempt is all we know (TaskContext.attempt counts ids)
        worker_ids = [me] * max(1, attempt)
        first_start = started_at
        errors = []
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=msg.result_id,
        status=RUNNING,
        enqueued_at=msg.enqueued_at,
        started_at=first_start,
        finished_at=None,
        last_attempted_at=started_at,
        args=msg.args,
        kwargs=msg.kwargs,
        backend=msg.backend,
        errors=errors,
        worker_ids=worker_ids,
    )
    task_started.send(type(backend), task_result=result)
    return result, keep


def _succeeded(
    backend: Any, result: TaskResult[Any, Any], msg: TaskMessage, value: Any, keep: bool
) -> None:
    finished_at = timezone.now()
    if keep:
        results.finished(msg, SUCCESSFUL, finished_at, return_value=value)
        results.sweep(backend.retention)
    object.__setattr__(result, "_return_value", value)
    object.__setattr__(result, "status", SUCCESSFUL)
    object.__setattr__(result, "finished_at", finished_at)
    task_finished.send(type(backend), task_result=result)


def _failed(msg: TaskMessage, result: TaskResult, exc: BaseException, keep: bool) -> None:
    """Record the failed attempt; the result stays READY. Whether another attempt follows
    is the consumer's decision alone (retry, or park: ``parked.on_task_parked`` makes the
    result FAILED and sends ``task_finished`` once the parked row is committed)."""
    error = TaskError(
        exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
        traceback="".join(format_exception(exc)),
    )
    try:
        if keep:
            results.finished(msg, READY, timezone.now(), error=error)
    except Exception:  # the task's own error decides what happens next, not this write
        logger.exception("task %s: could not record the failed attempt", msg.result_id)
    result.errors.append(error)
    object.__setattr__(result, "status", READY)
