"""Replay on close: what a dependency's exceptions parked goes back to work once it is back.

When a breaker closes (its probe succeeded, or an operator closed it) and the dependency's
``REPLAY_PARKED`` is on, the rows parked by one of its listed exceptions in a receiver that
depends on it (before the trip, or after a receiver's own ``max_attempts``) are requeued
through a background requeue operation (``parking.operations``), ramped and stopping at the
first new failure, like one an operator starts in the admin. Its ``created_by`` says the
breaker started it (``breaker:<name>``); an operator watches, pauses or cancels it there.

Only the process that won the close calls this, so one close starts one operation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.utils.module_loading import import_string

from ..core.breaker import Limits
from ..models import ParkedMessage, ParkedStatus, RequeueOperation
from ..parking import operations
from ..registry import default_registry

logger = logging.getLogger("django_rmq_retry.breakers")


def started_by(name: str) -> str:
    """The ``created_by`` of the operations a breaker starts."""
    return f"breaker:{name}"


def error_types(paths: Iterable[str]) -> set[str]:
    """The ``error_type`` values a parked row of these exceptions (or their subclasses)
    carries (``core.failure.error_type_name``)."""
    names: set[str] = set()
    todo: list[type] = []
    for path in paths:
        try:
            found = import_string(path)
        except ImportError:
            continue
        if isinstance(found, type) and issubclass(found, BaseException):
            todo.append(found)
    while todo:
        cls = todo.pop()
        name = _type_name(cls)
        if name not in names:
            names.add(name)
            todo.extend(cls.__subclasses__())
    return names


def _type_name(cls: type) -> str:
    """As ``core.failure.error_type_name`` names an instance of ``cls``."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def replay(name: str, limits: Limits) -> RequeueOperation | None:
    """Start the replay of ``name``'s parked rows, if it replays and any wait; the operation."""
    if not limits.replay_parked:
        return None
    receivers = [r.name for r in default_registry.all() if name in r.depends_on]
    kinds = error_types(limits.exceptions)
    if not receivers or not kinds:
        return None
    rows = ParkedMessage.objects.filter(
        status=ParkedStatus.PARKED, receiver__in=receivers, error_type__in=sorted(kinds)
    )
    if not rows.exists():
        return None
    op = operations.create(
        rows,
        user=started_by(name),
        description=(
            f"Replay after dependency {name} came back: messages of "
            f"{', '.join(receivers)} parked by {', '.join(sorted(kinds))} "
            "(started by the breaker)"
        ),
        ramp=True,
    )
    logger.warning(
        "dependency %s: replaying %d parked message(s) in requeue operation #%s",
        name,
        op.total,
        op.pk,
    )
    return op
