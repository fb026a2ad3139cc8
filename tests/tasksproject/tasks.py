"""Tasks the tests enqueue: each obeys its arguments, and remembers its runs in ``RUNS``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task

from django_rmq_retry.tasks import task as rmq_task

#: (task name, attempt, args) of every run in this process, in order.
RUNS: list[tuple[str, int, Any]] = []


class Permanent(Exception):
    """Never retried (``dont_retry``)."""


@task
def add(a: int, b: int) -> int:
    RUNS.append(("add", 1, [a, b]))
    return a + b


@task(takes_context=True, priority=10)
def flaky_task(context: TaskContext, succeed_on: int) -> dict[str, Any]:
    """Fails until attempt ``succeed_on`` (``TaskContext.attempt`` counts from 1)."""
    RUNS.append(("flaky", context.attempt, [succeed_on]))
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt, "result_id": context.task_result.id}


# Our decorator: Django 6.0's @task takes none of our options (6.1's and the backport's do).
@rmq_task(takes_context=True, max_attempts=2, dont_retry=(Permanent,))
def always_fails(context: TaskContext, how: str) -> None:
    RUNS.append(("always_fails", context.attempt, [how]))
    if how == "permanent":
        raise Permanent("this one is never retried")
    raise ValueError(f"failed on attempt {context.attempt}")


#: The thread each async task ran on (the consumer's event loop, or a test's thread).
ASYNC_THREADS: list[str] = []


@task(takes_context=True)
async def async_add(context: TaskContext, a: int, b: int) -> int:
    RUNS.append(("async_add", context.attempt, [a, b]))
    ASYNC_THREADS.append(threading.current_thread().name)
    await asyncio.sleep(0)
    if a < 0 and context.attempt < 2:
        raise ValueError("negative: fails on attempt 1")
    return a + b
