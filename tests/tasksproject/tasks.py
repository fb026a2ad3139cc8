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


class RateLimited(Exception):
    """Carries how long the remote side asks us to wait (it does not survive serialising)."""

    def __init__(self, retry_after: float | None) -> None:
        super().__init__(f"rate limited, retry after {retry_after}")
        self.retry_after = retry_after


def rate_limit_backoff(exception: BaseException, task_result: Any) -> float | None:
    """new-features#142's shape: the raw exception and the result that counts this attempt."""
    if isinstance(exception, RateLimited):
        return exception.retry_after
    return 5.0 * task_result.attempts


@rmq_task(takes_context=True, max_attempts=5, backoff=rate_limit_backoff)
def calls_a_rate_limited_api(context: TaskContext, waits: list[float | None]) -> int:
    """Raises RateLimited(waits[attempt - 1]) while there are waits left, then succeeds."""
    RUNS.append(("rate_limited", context.attempt, [waits]))
    if context.attempt <= len(waits):
        raise RateLimited(waits[context.attempt - 1])
    return context.attempt
