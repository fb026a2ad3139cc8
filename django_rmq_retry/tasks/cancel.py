"""Cancelling a task: ``cancel(result)`` (or ``RabbitMQBackend.cancel(result_id)``).

A task can be cancelled while it waits (deferred by ``run_after``, or between two attempts)
or once it was parked: its result row becomes CANCELLED in one conditional ``UPDATE``, and
the runner, which claims a task with one too (not CANCELLED -> RUNNING), acks it without
running it whenever it comes (its next round of the delay levels, its retry, a requeue of
its parked copy). A task already running or finished is not cancelled (``False``).

Django's statuses have no CANCELLED, so a cancelled task reads back as FAILED, its last
error a :class:`TaskCancelled`; the table and the admin say CANCELLED.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from . import results


class TaskCancelled(Exception):
    """The last error of a cancelled task's result (it was never raised by the task)."""


def cancel(result: Any) -> bool:
    """Cancel the task of ``result`` (a ``TaskResult`` of one of our backends)."""
    backend = result.task.get_backend()
    if not getattr(backend, "results", False):
        raise NotImplementedError(
            f"TASKS[{result.backend!r}] keeps no results (OPTIONS['results'] is False): "
            "a task is cancelled through its result row"
        )
    return results.cancel(result.id, result.backend)


acancel = sync_to_async(cancel)
