"""Periodic tasks: a schedule (interval or cron) that enqueues a task once per tick.

Declared in the backend's ``OPTIONS["periodic"]``::

    "periodic": {
        "nightly-report": {"task": "shop.tasks.report", "cron": "0 3 * * *"},
        "heartbeat": {"task": "shop.tasks.ping", "every": 60, "args": [], "kwargs": {}},
    }

or as rows in the admin (*Periodic tasks*). Every ``rmq_consume`` process steps them from
its housekeeping thread (:class:`Scheduler`): the rows are the state they share, and a
tick is one transition, a conditional ``UPDATE`` that moves ``next_run_at`` from the due
time the process read to the next one, in the same transaction as the enqueue (the result
row, and the publish on commit, or the outbox row). Of any number of processes that see a
tick due, one wins it; a process that dies mid-tick rolls it back for another to take.
Missed ticks (no consumer ran) follow ``core.schedule.next_due``: the overdue tick runs
once, the ones behind it are skipped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, router, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.module_loading import import_string

from ..core.schedule import Cron, ScheduleError, first_due, next_due
from ..models import PeriodicTask
from ..registry.task_api import TASK_BACKEND_PACKAGE
from .api import Task

logger = logging.getLogger("django_rmq_retry.tasks")

#: Due rows one step looks at (the rest wait for the next step, a second later).
BATCH = 100


def declared() -> dict[str, dict[str, Any]]:
    """``{name: spec}`` of every backend of ours (a spec with its backend alias)."""
    found: dict[str, dict[str, Any]] = {}
    for alias, conf in (getattr(settings, "TASKS", None) or {}).items():
        if not str(conf.get("BACKEND", "")).startswith(TASK_BACKEND_PACKAGE + "."):
            continue
        for name, spec in ((conf.get("OPTIONS") or {}).get("periodic") or {}).items():
            found[str(name)] = {**spec, "backend": alias}
    return found


def check_spec(name: str, spec: Mapping[str, Any]) -> None:
    """``ImproperlyConfigured``-style ``ValueError`` for a spec that cannot run."""
    unknown = set(spec) - {"task", "every", "cron", "args", "kwargs", "backend", "enabled"}
    if unknown:
        raise ValueError(f"periodic {name!r}: unknown key(s) {', '.join(sorted(unknown))}")
    if not isinstance(spec.get("task"), str):
        raise ValueError(f"periodic {name!r}: 'task' is the dotted path of a @task")
    if ("every" in spec) == ("cron" in spec):
        raise ValueError(f"periodic {name!r}: give 'every' (seconds) or 'cron', one of them")
    try:
        if "cron" in spec:
            Cron.parse(str(spec["cron"]))
        elif float(spec["every"]) <= 0:
            raise ScheduleError("'every' is a positive number of seconds")
    except (ScheduleError, TypeError, ValueError) as exc:
        raise ValueError(f"periodic {name!r}: {exc}") from exc


def sync_declared(now: datetime | None = None) -> None:
    """Make the rows say what the settings say (idempotent; run by every consumer at start).

    A row whose schedule changed starts over from now; one no longer declared is disabled
    (kept, with its history); rows made in the admin are left alone."""
    now = now or timezone.now()
    specs = declared()
    db = router.db_for_write(PeriodicTask)
    for name, spec in specs.items():
        check_spec(name, spec)
        fields = {
            "task_path": spec["task"],
            "backend": spec["backend"],
            "args": list(spec.get("args") or []),
            "kwargs": dict(spec.get("kwargs") or {}),
            "every_seconds": float(spec["every"]) if "every" in spec else None,
            "cron": str(spec.get("cron") or ""),
            "enabled": bool(spec.get("enabled", True)),
            "source": PeriodicTask.SETTINGS,
        }
        row = PeriodicTask.objects.using(db).filter(name=name).first()
        if row is None:
            # Another consumer may create it first: its row stands.
            with contextlib.suppress(IntegrityError), transaction.atomic(using=db):
                PeriodicTask.objects.using(db).create(
                    name=name, next_run_at=_first(fields, now), **fields
                )
            continue
        changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
        if not changed:
            continue
        if {"every_seconds", "cron"} & set(changed) or row.next_run_at is None:
            changed["next_run_at"] = _first(fields, now)
        PeriodicTask.objects.using(db).filter(pk=row.pk).update(**changed)
    gone = PeriodicTask.objects.using(db).filter(source=PeriodicTask.SETTINGS, enabled=True)
    gone = gone.exclude(name__in=list(specs))
    if gone.exists():  # no write (no SQLite write lock) when there is nothing to disable
        gone.update(enabled=False)


def _first(fields: Mapping[str, Any], now: datetime) -> datetime:
    cron = Cron.parse(fields["cron"]) if fields.get("cron") else None
    return first_due(now, every=fields.get("every_seconds"), cron=cron)


def tick_due(now: datetime | None = None) -> int:
    """Enqueue every due tick this process wins; returns how many it enqueued."""
    now = now or timezone.now()
    db = router.db_for_write(PeriodicTask)
    due = list(
        PeriodicTask.objects.using(db)
        .filter(enabled=True, next_run_at__lte=now)
        .order_by("next_run_at")[:BATCH]
    )
    return sum(_tick(row, now, db) for row in due)


def _tick(row: PeriodicTask, now: datetime, db: str) -> int:
    due = row.next_run_at
    assert due is not None
    try:
        cron = Cron.parse(row.cron) if row.cron else None
        following = next_due(due, now, every=row.every_seconds, cron=cron)
        task = _task(row)
    except Exception as exc:  # a schedule that cannot run: disabled, said once
        logger.error("periodic %s: disabled, it cannot run: %s", row.name, exc)
        PeriodicTask.objects.using(db).filter(pk=row.pk, next_run_at=due).update(enabled=False)
        return 0
    with transaction.atomic(using=db):
        won = (
            PeriodicTask.objects.using(db)
            .filter(pk=row.pk, enabled=True, next_run_at=due)
            .update(next_run_at=following, last_run_at=due, runs=F("runs") + 1)
        )
        if not won:
            return 0  # another consumer took this tick
        result = task.enqueue(*row.args, **row.kwargs)
        PeriodicTask.objects.using(db).filter(pk=row.pk).update(last_result_id=result.id)
    logger.info(
        "periodic %s: tick %s enqueued as task %s (next tick %s)",
        row.name,
        due.isoformat(),
        result.id,
        following.isoformat(),
        extra={"periodic": row.name, "tick": due.isoformat(), "task_result": result.id},
    )
    return 1


def _task(row: PeriodicTask) -> Task:
    task = import_string(row.task_path)
    if not isinstance(task, Task):
        raise TypeError(f"{row.task_path} is not a task (decorate it with @task)")
    return task.using(backend=row.backend) if row.backend != task.backend else task


class Scheduler:
    """One consumer process's stepping of the schedules (its housekeeping thread calls
    :meth:`step` about once a second): the declared ones synced at the first step.

    A step that fails (the database or the broker away) is logged once per failing spell,
    not every second, and the next step tries again."""

    def __init__(self) -> None:
        self._synced = False
        self._failing = False

    def step(self) -> int:
        try:
            if not self._synced:
                sync_declared()
                self._synced = True
            done = tick_due()
        except Exception:
            if not self._failing:
                logger.exception("periodic tasks: a step failed; trying again each second")
            self._failing = True
            return 0
        if self._failing:
            logger.info("periodic tasks: stepping again")
        self._failing = False
        return done
