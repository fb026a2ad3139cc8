"""The thread that advances background requeue operations in a consumer process.

It also looks for failure-group alerts (``parking.alerts``). Started with the housekeeper
(``rmq_consume`` and ``rmq_relay``); ``manage.py
rmq_operations`` runs the same loop on its own. Several processes may run it: a lease on the
operation's row lets one of them step it at a time. Idle, it costs one indexed query a
second.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from django.db import DatabaseError, close_old_connections, connections

from ..conf import app_settings
from ..core.errors import PublishError
from ..db.threads import start_daemon
from ..parking import alerts, operations, snapshots

logger = logging.getLogger("django_rmq_retry.operations")

#: Seconds between two looks for a due operation when none is running.
IDLE_POLL = 1.0
#: The longest wait after unexpected errors in a row.
MAX_BACKOFF = 30.0


class OperationsRunner:
    """Steps due operations until ``stop`` is set (``once``: until none is running)."""

    def __init__(self, stop: threading.Event, *, once: bool = False, only: int | None = None):
        self.stop = stop
        self.once = once
        self.only = only
        self.steps = 0
        self._owner = operations.new_owner()
        self._thread: threading.Thread | None = None
        self._next_alerts = 0.0
        self._next_snapshot = 0.0
        self._failures = 0

    def start(self) -> None:
        operations.flusher_running.set()
        self._thread = start_daemon(self.run, "rmq-operations")

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        try:
            self._loop()
        finally:
            operations.flusher_running.clear()
            with contextlib.suppress(DatabaseError):
                operations.flush_handled()  # the receivers' last reports
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()  # this thread's own connections (none outlive it)

    def _alerts(self) -> None:
        """Failure-group alerts every ALERT_CHECK_SECONDS (not in a command's own run)."""
        every = float(app_settings.ALERT_CHECK_SECONDS)
        if self.only is not None or every <= 0 or time.monotonic() < self._next_alerts:
            return
        self._next_alerts = time.monotonic() + every
        alerts.check()

    def _snapshots(self) -> None:
        """The dashboard's hourly points (``parking.snapshots``), once a minute."""
        if self.only is not None or time.monotonic() < self._next_snapshot:
            return
        self._next_snapshot = time.monotonic() + snapshots.SNAPSHOT_EVERY
        snapshots.take()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                operations.flush_handled()
                self.steps += operations.advance_due(owner=self._owner, only=self.only)
                wait = operations.next_due_in(IDLE_POLL, only=self.only)
                self._alerts()
                self._snapshots()
                if self.once and not operations.running(only=self.only):
                    return
                self._failures = 0
            except (DatabaseError, PublishError) as exc:
                logger.warning("requeue operations: %s; retrying", exc)
                close_old_connections()
                wait = IDLE_POLL
            except Exception:
                # A bug of ours, or of a hook: said with its traceback, and the thread goes on
                # (dead, it would silently stop every operation this process could step),
                # waiting longer after each failure in a row so a lasting one does not flood.
                self._failures += 1
                wait = min(MAX_BACKOFF, IDLE_POLL * 2 ** (self._failures - 1))
                logger.exception("requeue operations: unexpected error; retrying in %g s", wait)
                close_old_connections()
            self.stop.wait(wait)
