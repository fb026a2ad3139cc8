"""What became of a background operation's copies: handled, or failed again.

Each outcome moves one item and the operation's counters in one transaction (``F()``
updates from the items' row counts), so no step ever recounts the items:

* **handled**: the consumer calls :func:`report_handled` once a receiver returned for a
  delivery carrying the operation header; the reports are written in batches by
  :func:`flush_handled`;
* **failed again**: a copy that runs out of attempts returns to its own row (the
  ``parked-id`` header), and ``parking.intake`` calls :func:`failed_again` in that
  parking's own transaction.

An item moves only from a state that awaits an outcome (sent, being sent, or outcome
unknown), each such state by its own conditional ``UPDATE``: a report counted once, however
many times it is repeated (a redelivery, a flush retried), and in whichever order the
step's own marks and the reports reach the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from ..core.backoff import CappedBackoff
from ..db import locks
from ..db.threads import start_daemon
from ..models import (
    ItemState,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)

logger = logging.getLogger("django_rmq_retry.operations")

#: Rows an outcome write touches at once.
CHUNK = 1000

#: Handled reports waiting for the next flush: (operation id, parked id, the copy's
#: requeue count).
_handled: list[tuple[int, int, int]] = []
_handled_lock = threading.Lock()
#: Set while an operations runner of this process flushes the reports.
flusher_running = threading.Event()
#: The thread writing reports again after a failed write, when no runner does (or None).
_retrier: threading.Thread | None = None
#: Seconds between two tries of that thread: from a round of the runner's to a few of them.
RETRY_START, RETRY_CAP = 0.5, 5.0
#: The longest a report written on a receiver's thread waits for a row another transaction
#: holds (a step settling its batch, an editor): past it the report is handed to the
#: retrying thread, and the receiver goes on to its next message.
REPORT_LOCK_WAIT = 1.0


def operation_tag(created_by: str, op_id: int) -> str:
    """Who requeued a row, as an operation's rows say it (``status_changed_by``)."""
    return f"{created_by} (operation #{op_id})"[:150]


def report_handled(
    headers: Mapping[str, Any] | None, operation_header: str, parked_id_header: str
) -> None:
    """Called by the consumer once a receiver returned for a delivery: if the delivery is
    an operation's copy, its item is handled.

    With the process's operations thread running (the consumer's housekeeper), the report
    waits in memory for its next round (at most a second; one UPDATE per round, not one
    per message on the receiver's thread); otherwise it is written at once, and if that
    write fails (a lock timeout, the database away) a thread of its own writes it again
    until it gets through, with the reports that come meanwhile: without it, an
    operation's last reports would wait for a next report that never comes. Never raises:
    a lost report (the process died first) leaves the item waiting until
    ``OPERATION_OUTCOME_TIMEOUT``, then counted "outcome unknown", never a message lost or
    sent twice.
    """
    if not headers:
        return
    op = headers.get(operation_header)
    if op is None:
        return
    try:
        # The requeue count header under the same prefix as the operation header.
        prefix = operation_header.removesuffix("operation")
        requeued = int(headers.get(f"{prefix}requeued") or 0)
        key = (int(op), int(headers.get(parked_id_header) or 0), requeued)
    except (TypeError, ValueError):
        return
    with _handled_lock:
        _handled.append(key)
        retrying = _retrier is not None
    if not flusher_running.is_set() and not retrying:
        flush_handled(lock_wait=REPORT_LOCK_WAIT)
        _retry_what_is_left()


def _retry_what_is_left() -> None:
    """Start the retrying thread if reports are left over from a failed write."""
    global _retrier
    with _handled_lock:
        if _handled and _retrier is None and not flusher_running.is_set():
            _retrier = start_daemon(_retry, "rmq-operation-reports")


def _retry() -> None:
    """Write the reports left over until none is (or a runner flushes them), with a capped
    backoff; the reports that arrive meanwhile wait here instead of each trying (and
    waiting on the database) on a receiver's thread."""
    global _retrier
    backoff = CappedBackoff(RETRY_START, RETRY_CAP)
    try:
        while True:
            with _handled_lock:  # the decision and the hand-back in one hold of the lock
                if not _handled or flusher_running.is_set():
                    _retrier = None
                    return
            time.sleep(backoff.next())
            flush_handled(lock_wait=REPORT_LOCK_WAIT)
    except BaseException:
        with _handled_lock:
            _retrier = None
        raise


def flush_handled(*, lock_wait: float | None = None) -> int:
    """Write the handled reports waiting in memory; how many (0 if the write failed: they
    wait for the next flush). ``lock_wait`` bounds each wait for a locked row (PostgreSQL;
    ``None``: as long as it takes), so a thread with other work (a receiver's) is never
    held by another process's transaction, however long that one lasts."""
    with _handled_lock:
        batch = _handled[:]
        _handled.clear()
    if not batch:
        return 0
    by_op: dict[int, dict[int, int]] = {}
    for op_id, parked_id, requeued in batch:
        by_op.setdefault(op_id, {})[parked_id] = requeued
    try:
        for op_id, copies in by_op.items():
            ids = sorted(copies)
            for start in range(0, len(ids), CHUNK):
                with locks.bounded("default", lock_wait):
                    _handled_chunk(op_id, {pk: copies[pk] for pk in ids[start : start + CHUNK]})
    except Exception as exc:
        if locks.timed_out(exc):  # another transaction holds a row: no traceback to show
            logger.warning(
                "could not write %d handled report(s): a row they change is locked by "
                "another transaction; retrying",
                len(batch),
            )
        else:
            logger.warning(
                "could not write %d handled report(s); retrying", len(batch), exc_info=True
            )
        with _handled_lock:
            _handled[:0] = batch
        return 0
    return len(batch)


def _handled_chunk(op_id: int, copies: dict[int, int]) -> None:
    """Items of ``copies`` (parked id: the copy's requeue count) handled, in one transaction.

    A copy a step published but did not mark (the step died between the broker's confirm
    and its marks) left its row parked: the row is marked requeued here, as the step
    would have, only if it is still as the copy left it (parked, requeued one time fewer),
    so no later requeue sends that row again.

    Locks in the order every writer of operations takes them (parked rows, then the
    operation, then its items), so two never wait for each other.
    """
    now = timezone.now()
    created_by = (
        RequeueOperation.objects.filter(pk=op_id).values_list("created_by", flat=True).first()
    )
    if created_by is None:
        return  # deleted meanwhile
    by_count: dict[int, list[int]] = {}
    for pk, requeued in copies.items():
        if requeued > 0:
            by_count.setdefault(requeued, []).append(pk)
    # Writes first: on SQLite a transaction that read first may not be let write.
    with transaction.atomic():
        for requeued, pks in sorted(by_count.items()):
            ParkedMessage.objects.filter(
                pk__in=sorted(pks), status=ParkedStatus.PARKED, requeue_count=requeued - 1
            ).update(
                status=ParkedStatus.REQUEUED,
                status_changed_at=now,
                status_changed_by=operation_tag(created_by, op_id),
                requeue_count=requeued,
            )
        lock_operation(op_id, "default")
        items = RequeueItem.objects.filter(operation_id=op_id, parked_id__in=list(copies))
        moved = {
            state: items.filter(state=state).update(state=ItemState.HANDLED)
            for state in (ItemState.SENT, ItemState.SENDING, ItemState.UNKNOWN)
        }
        total = sum(moved.values())
        if total:
            RequeueOperation.objects.filter(pk=op_id).update(
                handled=F("handled") + total,
                sent=F("sent") + moved[ItemState.SENDING],
                unknown=F("unknown") - moved[ItemState.UNKNOWN],
                last_outcome_at=now,
            )


def lock_operation(op_id: int, using: str) -> None:
    """Lock the operation's row until the transaction ends (PostgreSQL; SQLite writes one
    at a time anyway): taken before any of its items, by every writer."""
    if not connections[using].features.has_select_for_update:
        return
    list(
        RequeueOperation.objects.using(using)
        .select_for_update()
        .filter(pk=op_id)
        .values_list("pk", flat=True)
    )


def failed_again(op_id: int, parked_id: int, using: str) -> None:
    """The copy of row ``parked_id`` that operation ``op_id`` sent failed again: called
    inside the parking's transaction, so the row and its item change together."""
    items = RequeueItem.objects.using(using).filter(operation_id=op_id, parked_id=parked_id)
    state = items.values_list("state", flat=True).first()
    if state not in (ItemState.SENT, ItemState.SENDING, ItemState.UNKNOWN):
        return
    lock_operation(op_id, using)
    if not items.filter(state=state).update(state=ItemState.FAILED):
        return
    RequeueOperation.objects.using(using).filter(pk=op_id).update(
        failed_again=F("failed_again") + 1,
        sent=F("sent") + (1 if state == ItemState.SENDING else 0),
        unknown=F("unknown") - (1 if state == ItemState.UNKNOWN else 0),
        last_outcome_at=timezone.now(),
    )
