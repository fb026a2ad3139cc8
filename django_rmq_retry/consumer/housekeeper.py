"""The consumer's background chores, on a thread of their own: the outbox relay (publish
committed outbox rows), and hourly the purge of old inbox rows and a look at the triggers
that keep the failure-group counts. ``rmq_relay`` runs the same loop for projects that only
publish."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from ..conf import app_settings
from ..core.backoff import CappedBackoff
from ..core.errors import PublishError
from ..db.threads import start_daemon
from ..models import OutboxMessage, OutboxStatus
from ..outbox import RelayRound, publish_pending, relay_wakeup
from ..outbox.drain import Drain
from ..outbox.relay import WAITING_PAUSE
from ..parking import group_counts, holds
from .inbox import purge_handled
from .operations_runner import OperationsRunner

logger = logging.getLogger("django_rmq_retry.outbox")

#: Seconds between two rounds of the hourly chores (the first one at start).
CHORES_EVERY = 3600.0
#: Seconds between two checks of the thread's database connection (``close_old_connections``).
RECYCLE_EVERY = 60.0
#: Seconds a per-key hold released by an operator may stay releasing with no progress
#: before its rows are published again (the publish never happened: that process died
#: between its commit and its publish). A copy published twice finds its row gone the
#: second time and is acked: a copy still queued behind a long backlog costs a duplicate at
#: worst, never order.
RELEASE_STALL_SECONDS = 600.0


class Housekeeper:
    """Relay the outbox until ``stop`` is set; ``once=True`` stops once nothing pending now
    is left to publish (rows backing off after a refusal, or held, stay)."""

    def __init__(
        self,
        stop: threading.Event,
        *,
        using: str = "default",
        purge_inbox: bool = True,
        once: bool = False,
    ) -> None:
        self.stop = stop
        self.using = using
        self.purge_inbox = purge_inbox
        self.once = once
        self.published = 0
        self.held = 0
        self._thread: threading.Thread | None = None
        self._drain = Drain()
        #: Background requeue operations, stepped on a thread of their own (the relay's
        #: waits would pace them otherwise).
        self._operations = None if once else OperationsRunner(stop)
        #: Periodic tasks (``tasks.periodic``), stepped each round when tasks are ours.
        self._scheduler = None if once else _scheduler()

    def start(self) -> None:
        self._thread = start_daemon(self.run, "rmq-outbox-relay")
        if self._operations is not None:
            self._operations.start()

    def join(self, timeout: float) -> None:
        relay_wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._operations is not None:
            self._operations.join(timeout)

    def run(self) -> None:
        backoff = CappedBackoff(0.5, float(app_settings.RECONNECT_MAX_DELAY))
        next_chores = 0.0
        next_recycle = 0.0
        next_sweep = 0.0
        while not self.stop.is_set():
            relay_wakeup.clear()
            if time.monotonic() >= next_recycle:
                # CONN_MAX_AGE and connections the database dropped; not every poll: with
                # Django's default CONN_MAX_AGE = 0 that would be a new connection a second.
                next_recycle = time.monotonic() + RECYCLE_EVERY
                close_old_connections()
            try:
                step = self._relay_round()
                backoff.reset()
            except PublishError as exc:
                logger.warning("outbox relay: broker unavailable (%s); retrying", exc)
                self.stop.wait(backoff.next())
                continue
            except DatabaseError as exc:
                logger.warning("outbox relay: database error (%s); retrying", exc)
                next_recycle = 0.0  # a fresh connection next time
                self.stop.wait(backoff.next())
                continue
            if time.monotonic() >= next_chores:
                next_chores = time.monotonic() + CHORES_EVERY
                self._chores()
            if time.monotonic() >= next_sweep:  # per-key order: releases whose copies got lost
                next_sweep = time.monotonic() + RELEASE_STALL_SECONDS / 3
                _sweep_stalled_releases()
            if self._scheduler is not None:
                self._scheduler.step()  # never raises: it logs a failing spell once
            if step == Drain.NEXT:
                continue
            if step == Drain.PAUSE:  # rows held up by another relay's round
                self.stop.wait(WAITING_PAUSE)
                continue
            if self.once:
                return
            relay_wakeup.wait(float(app_settings.OUTBOX_POLL_SECONDS))

    def _relay_round(self) -> str:
        """One round, where :class:`Drain` says it starts; returns what ``Drain`` says next."""
        if self._drain.after is None:
            pending = OutboxMessage.objects.using(self.using).filter(status=OutboxStatus.PENDING)
            if not pending.exists():  # idle: one indexed query, no transaction, no lock
                return self._drain.advance(RelayRound())
        try:
            done = publish_pending(using=self.using, after=self._drain.after)
        except BaseException:
            self._drain.restart()
            raise
        self._count(done)
        return self._drain.advance(done)

    def _count(self, done: RelayRound) -> None:
        self.published += done.published
        self.held += done.held
        if done.held:
            logger.error(
                "outbox: %d message(s) held after %d refused attempts; see the admin's "
                "outbox messages",
                done.held,
                int(app_settings.OUTBOX_MAX_ATTEMPTS),
            )

    def _chores(self) -> None:
        try:
            if self.purge_inbox:
                purged = purge_handled(using=self.using)
                if purged:
                    logger.info(
                        "purged %d handled-message row(s) past INBOX_RETENTION_DAYS", purged
                    )
            vendor = connections[self.using].vendor
            if vendor in group_counts.VENDORS and not group_counts.triggers_installed(self.using):
                logger.error(
                    "the triggers that keep the failure-group counts of parked messages are "
                    "missing (a migration that rebuilt the table on SQLite drops them): the "
                    "admin's failure-groups page groups every row until you run "
                    "`manage.py rmq_recount_parked`"
                )
        except DatabaseError as exc:
            logger.warning("hourly chores failed (%s); next try in an hour", exc)


def _scheduler() -> Any:
    """The periodic tasks' scheduler, when ``TASKS`` names our backend and this Django has
    a task API (imported only then: the tasks package needs it)."""
    from ..registry.task_api import task_api_module, uses_task_backend

    if not uses_task_backend() or task_api_module() is None:
        return None
    from ..tasks.periodic import Scheduler

    return Scheduler()


def _sweep_stalled_releases() -> None:
    try:
        holds.release_stalled(RELEASE_STALL_SECONDS)
    except Exception:  # the database or the broker is away: the next round tries again
        logger.exception("per-key order: publishing the rows of stalled releases failed")
