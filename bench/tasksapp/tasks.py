"""A no-op task and one that fails its first attempt, for every backend of ``bench/tasks.py``.

Each worker process appends ``<epoch seconds> <pid>`` to ``BENCH_TASKS_MARK`` on its first
task, once: the benchmark times the rows from the moment every worker is running, so the
workers' start-up (and their uneven start) is left out; nothing else is written per task.
"""

from __future__ import annotations

import os
import time
from typing import Any

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]

_marked = False


def _mark() -> None:
    global _marked
    if _marked:
        return
    _marked = True
    path = os.environ.get("BENCH_TASKS_MARK")
    if path:
        with open(path, "a") as out:
            out.write(f"{time.time():.6f} {os.getpid()}\n")


@task
def noop(i: int) -> int:
    _mark()
    return i


@task(takes_context=True)
def fail_once(context: TaskContext, i: int) -> int:
    """Raises on its first attempt; succeeds on the second (returns the attempt: 2)."""
    _mark()
    if context.attempt < 2:
        raise RuntimeError(f"task {i}: attempt {context.attempt} fails")
    return context.attempt


def names() -> dict[str, Any]:
    return {"noop": noop, "fail_once": fail_once}
