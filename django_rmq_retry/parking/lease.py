"""The lease one process holds on a background operation while it steps it.

Why renewed, not long enough for the worst step: a step can wait on the broker for minutes
(a blocked connection waits ``BLOCKED_CONNECTION_TIMEOUT``, 300 s by default; each nack
pause up to ``PUBLISH_NACK_WAIT``, 20 s; each reconnect ``CONNECT_TIMEOUT``, 10 s), so a
lease outliving it would leave an operation whose stepper died untouched for more than
five minutes. Instead, with a lease of ``L`` seconds (``OPERATION_LEASE_SECONDS``, 30):

* the step renews it every ``L/3`` seconds on a thread of its own (its own database
  connection, so a step waiting on the broker still renews), and at each batch it fences;
* another process takes the operation over only after ``L`` seconds with no renewal: at
  least two renewals missed in a row, so a database stall shorter than ``2L/3`` (20 s)
  never hands a living step's operation to another process, while a dead stepper's
  operation goes on after ``L`` seconds at most.

Each step holds its own token (``lease_owner``); every write the step makes requires it,
so a step that froze past its lease and woke after a takeover writes nothing more.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta

from django.db import DatabaseError, transaction
from django.utils import timezone

from ..conf import app_settings
from ..db.threads import start_daemon
from ..models import RequeueOperation

logger = logging.getLogger("django_rmq_retry.operations")


def seconds() -> float:
    return float(app_settings.OPERATION_LEASE_SECONDS)


def until() -> timedelta:
    return timedelta(seconds=seconds())


def token(owner: str) -> str:
    """A token for one step of ``owner`` (a process): unique, so no step re-enters another's."""
    return f"{owner[:55]}:{uuid.uuid4().hex[:8]}"


class Keeper:
    """Renews the lease ``token`` holds on operation ``op_id`` every third of the lease,
    until :meth:`stop`; ``lost`` is set once a renewal finds the lease gone."""

    def __init__(self, op_id: int, token: str, using: str = "default") -> None:
        self.op_id = op_id
        self.token = token
        self.using = using
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # Inside a caller's transaction (a test's) another connection would wait for it.
        if not transaction.get_connection(self.using).in_atomic_block:
            self._thread = start_daemon(self._run, "rmq-operation-lease")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(seconds())

    def _run(self) -> None:
        every = seconds() / 3
        while not self._stop.wait(every):
            try:
                renewed = (
                    RequeueOperation.objects.using(self.using)
                    .filter(pk=self.op_id, lease_owner=self.token)
                    .update(lease_until=timezone.now() + until())
                )
            except DatabaseError as exc:  # the next renewal may get through
                logger.warning("requeue operation #%s: lease not renewed: %s", self.op_id, exc)
                continue
            if not renewed:
                self.lost.set()
                return
