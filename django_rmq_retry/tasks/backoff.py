"""A task's ``backoff``: the wait before its next attempt, chosen by the task's own function.

The semantics proposed for Django's tasks (``@task(max_attempts=..., backoff=fn)``): after a
failed attempt, ``fn(exception, task_result)`` returns the seconds (or a ``timedelta``) to
wait before the next one, or ``None`` for no more attempts. ``task_result`` already holds
this attempt's error and counts it, and the exception is the raw one (its attributes, a
429's ``Retry-After``, did not have to survive serialisation). The answer goes to the
consumer as a ``Retry(delay=...)`` or a ``Reject``, so the consumer's one decision applies it
(``max_attempts`` still parks the last attempt, the wait is held by the broker's levels), and
an exception the policy never retries (``dont_retry``) is parked without asking ``fn``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils.module_loading import import_string

from ..core.backoff import matches
from ..core.errors import Reject, Retry
from ..registry import Receiver
from ..registry.policies import policy_cache

logger = logging.getLogger("django_rmq_retry.tasks")


def chosen(
    task: Any, backend: Any, receiver: Receiver, exc: BaseException, task_result: Any
) -> BaseException | None:
    """What the consumer should see instead of ``exc`` (``None``: ``exc`` itself)."""
    fn: Callable[[BaseException, Any], Any] | str | None = getattr(
        task, "backoff", None
    ) or getattr(backend, "backoff", None)
    if fn is None or isinstance(exc, (Retry, Reject)):
        return None
    if matches(exc, policy_cache.for_receiver(receiver).dont_retry):
        return None
    try:
        func = import_string(fn) if isinstance(fn, str) else fn
        wait = func(exc, task_result)
    except Exception:  # a broken backoff must not lose the task: the policy's own delay
        logger.exception("task %s: its backoff function failed", task_result.id)
        return None
    if wait is None:
        return Reject(f"{type(exc).__name__}: {exc} (backoff said: no more attempts)")
    seconds = wait.total_seconds() if isinstance(wait, timedelta) else float(wait)
    return Retry(f"{type(exc).__name__}: {exc}", delay=max(0.0, seconds))
