"""``task``: Django's ``@task`` with our retry options, the same on every Django.

Django 6.1's ``@task`` (and the backport's) hands unknown keywords to the backend's task
class, so ``@task(max_attempts=3)`` works there; Django 6.0's takes none. This decorator
takes ours itself and gives Django's decorator only Django's, so one ``tasks.py`` reads the
same on 5.2 + backport, 6.0 and 6.1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..core.backoff import Policy
from . import api
from .backend import RabbitMQTask


def task(
    function: Callable[..., Any] | None = None,
    *,
    max_attempts: int | None = None,
    retry: Policy | Mapping[str, Any] | None = None,
    dont_retry: Iterable[Any] = (),
    backoff: Callable[[BaseException, Any], Any] | str | None = None,
    **options: Any,
) -> Any:
    """``@task`` / ``@task(...)``: ``options`` are Django's (``priority``, ``queue_name``,
    ``backend``, ``takes_context``); ``max_attempts``, ``retry``, ``dont_retry`` and ``backoff`` are
    :class:`~.backend.RabbitMQTask`'s (a ``TypeError`` on another backend's task)."""
    ours: dict[str, Any] = {}
    if max_attempts is not None:
        ours["max_attempts"] = max_attempts
    if retry is not None:
        ours["retry"] = retry
    if dont_retry:
        ours["dont_retry"] = tuple(dont_retry)
    if backoff is not None:
        ours["backoff"] = backoff

    def wrap(func: Callable[..., Any]) -> Any:
        made = api.task(func, **options)
        if not ours:
            return made
        if not isinstance(made, RabbitMQTask):
            raise TypeError(
                f"{', '.join(sorted(ours))}: options of RabbitMQBackend's tasks, but "
                f"TASKS[{made.backend!r}] is {type(made.get_backend()).__name__}"
            )
        return dataclasses.replace(made, **ours)

    return wrap(function) if function is not None else wrap
