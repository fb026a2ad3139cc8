"""The consumer's notifier thread: work that follows a settled delivery, off the I/O thread.

The consumer's loop must only move frames: anything slower there (a ``message_retried``
handler posting an alert, a database delete) holds up every other ack and the heartbeats,
and a long enough stall makes the broker drop the connection. Such work is queued here and
runs in order on one daemon thread; nothing waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from queue import SimpleQueue

from django.db import close_old_connections

from ..db.threads import start_daemon

logger = logging.getLogger("django_rmq_retry.consumer")


class Notifier:
    """Runs queued callables one after another on a daemon thread (see the module docstring)."""

    def __init__(self, name: str = "rmq-notifier") -> None:
        self._queue: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._thread = start_daemon(self._loop, name)

    def submit(self, work: Callable[[], None]) -> None:
        """From any thread: run ``work`` soon on the notifier thread."""
        self._queue.put(work)

    def close(self, timeout: float = 5.0) -> None:
        """Run what is queued, then stop; waits at most ``timeout`` seconds for it."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            try:
                work()
            except Exception:  # one failing notification must not stop the others
                logger.exception("a consumer notification failed")
            if self._queue.empty():
                close_old_connections()
