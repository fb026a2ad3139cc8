"""Background requeue operations: canary, ramp, rate, stop at the first new failure.

An operation is a row (:class:`~django_rmq_retry.models.RequeueOperation`) and its
selection, fixed when it is created (one :class:`~django_rmq_retry.models.RequeueItem` per
parked row, written by one ``INSERT ... SELECT``: rows parked later never join). The admin
and ``rmq_requeue`` only create, watch, pause, resume and cancel operations; the consumers'
housekeeping thread or ``manage.py rmq_operations`` advance them with :func:`advance_due`,
one step at a time, one process per operation at a time (a lease on the row).

Each step publishes through :func:`~django_rmq_retry.parking.requeue` (claims, confirms,
then marks: never a row twice, at least once), with a header naming the operation. How an
operation learns what became of a copy:

* **failed again**: a copy that runs out of attempts parks its own row again (the
  ``parked-id`` header), so a sent item whose row is parked again failed again;
* **handled**: the consumer calls :func:`report_handled` after the receiver returned for a
  delivery carrying the operation header.

A step sends what the options allow: the canary first (then waits until every canary copy
is handled or failed again), then batches growing 1, 5, 20, 100, ... with ``ramp`` (each
batch waits for its outcome too), paced to ``rate`` messages a second.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from ..conf import app_settings, current_names
from ..core.errors import PublishError
from ..models import (
    ItemState,
    OperationState,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from .requeuing import MODE_RECEIVER, MODE_TOPIC, RequeueInterrupted, requeue

logger = logging.getLogger("django_rmq_retry.operations")

#: The ramp's batch sizes; past the last one, ``BATCH_SIZE`` rows a step.
RAMP = (1, 5, 20, 100, 500)
#: Seconds a step's lease holds: another process takes the operation over after that.
LEASE_SECONDS = 30.0
#: A paced step sends at most this many seconds' worth of the rate (smooth, not bursty).
PACE_SECONDS = 0.5
#: Seconds of lag a paced step may catch up (the rate's clock never runs further back).
CATCH_UP_SECONDS = 1.0
#: Seconds between two steps of an operation waiting for outcomes.
WAIT_SECONDS = 0.5
#: Rows a step sends at most (``RequeueResult.requeued_ids`` lists up to 1,000).
MAX_STEP = 1000
#: The header (under the prefix) naming the operation on a requeued copy.
HEADER = "operation"

ACTIVE = (OperationState.RUNNING, OperationState.PAUSED)


def header_name() -> str:
    return current_names().header(HEADER)


def new_owner() -> str:
    """A name for this process's lease on the operations it steps."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"[:64]


# ----------------------------------------------------------------------------------------
# Create, watch, pause, resume, cancel


def create(
    queryset: QuerySet[ParkedMessage],
    *,
    user: str,
    description: str = "",
    mode: str = MODE_RECEIVER,
    canary: int = 0,
    ramp: bool = False,
    rate: float | None = None,
    stop_on_failure: bool = True,
    limit: int | None = None,
) -> RequeueOperation:
    """An operation over the rows of ``queryset`` parked now (fixed here, by the database).

    One ``INSERT ... SELECT`` copies the ids: no row travels through Python, so a selection
    of 100,000 rows costs one statement over the index the filter uses.
    """
    if mode not in (MODE_RECEIVER, MODE_TOPIC):
        raise ValueError(f"unknown requeue mode {mode!r}")
    if canary < 0 or (rate is not None and rate <= 0):
        raise ValueError("canary must be >= 0 and rate > 0")
    using = queryset.db
    now = timezone.now()
    ids = queryset.filter(status=ParkedStatus.PARKED).order_by("pk").values("pk")
    if limit is not None:
        ids = ids[:limit]
    sql, params = ids.query.sql_with_params()
    item_table = RequeueItem._meta.db_table
    q = connections[using].ops.quote_name
    with transaction.atomic(using=using):
        op = RequeueOperation.objects.using(using).create(
            created_by=user[:150],
            created_at=now,
            updated_at=now,
            next_at=now,
            description=description,
            mode=mode,
            canary=canary,
            ramp=ramp,
            rate=rate,
            stop_on_failure=stop_on_failure,
        )
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {q(item_table)} ({q('operation_id')}, {q('parked_id')}, "
                f"{q('state')}) SELECT %s, sel.*, %s FROM ({sql}) sel",  # one column: the id
                [op.pk, ItemState.PENDING, *params],
            )
            op.total = cursor.rowcount
        op.save(update_fields=["total"])
    if op.total == 0:
        _finish(op, OperationState.DONE, "Nothing to requeue: no selected message is parked.")
    logger.info("requeue operation #%s created by %s: %d rows", op.pk, user, op.total)
    return op


def _set_state(
    op_id: int,
    allowed: tuple[Any, ...],
    state: Any,  # an OperationState (the stubs type its members as tuples)
    user: str,
    reason: str,
) -> bool:
    now = timezone.now()
    changed = RequeueOperation.objects.filter(pk=op_id, state__in=allowed).update(
        state=state,
        state_reason=reason,
        state_changed_by=user[:150],
        updated_at=now,
        next_at=now,
        lease_until=None,
    )
    return bool(changed)


def pause(op_id: int, user: str) -> bool:
    return _set_state(
        op_id, (OperationState.RUNNING,), OperationState.PAUSED, user, f"Paused by {user}."
    )


def resume(op_id: int, user: str) -> bool:
    return _set_state(
        op_id,
        (OperationState.PAUSED, OperationState.STOPPED),
        OperationState.RUNNING,
        user,
        f"Resumed by {user}.",
    )


def cancel(op_id: int, user: str) -> bool:
    """Stop for good: what was not sent stays parked (sent copies are not called back)."""
    return _set_state(op_id, ACTIVE, OperationState.CANCELLED, user, f"Cancelled by {user}.")


@dataclass(frozen=True)
class Progress:
    """What the admin's progress view and ``rmq_requeue`` show."""

    id: int
    state: str
    state_label: str
    reason: str
    total: int
    sent: int
    handled: int
    failed_again: int
    refused: int
    skipped: int
    left: int
    waiting: int  # sent, outcome not known yet
    rate: float | None
    achieved_rate: float | None
    updated_at: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def progress(op: RequeueOperation) -> Progress:
    achieved = None
    if op.started_sending_at and op.last_sent_at and op.sent > 1:
        seconds = (op.last_sent_at - op.started_sending_at).total_seconds()
        if seconds > 0:
            achieved = round((op.sent - 1) / seconds, 2)
    left = max(0, op.total - op.sent - op.refused - op.skipped)
    return Progress(
        id=op.pk,
        state=op.state,
        state_label=str(op.get_state_display()),
        reason=op.state_reason,
        total=op.total,
        sent=op.sent,
        handled=op.handled,
        failed_again=op.failed_again,
        refused=op.refused,
        skipped=op.skipped,
        left=left,
        waiting=max(0, op.sent - op.handled - op.failed_again),
        rate=op.rate,
        achieved_rate=achieved,
        updated_at=op.updated_at.isoformat(),
    )


# ----------------------------------------------------------------------------------------
# Outcomes


#: Handled reports waiting for the next flush: (operation id, parked id).
_handled: list[tuple[int, int]] = []
_handled_lock = threading.Lock()
#: Set while an :class:`OperationsRunner` of this process flushes the reports.
flusher_running = threading.Event()


def report_handled(
    headers: Mapping[str, Any] | None, operation_header: str, parked_id_header: str
) -> None:
    """Called by the consumer once a receiver returned for a delivery: if the delivery is
    an operation's copy, its item is handled.

    With the process's operations thread running (the consumer's housekeeper), the report
    waits in memory for its next round (at most a second; one UPDATE per round, not one
    per message on the receiver's thread); otherwise it is written at once. Never raises:
    a lost report leaves the item waiting, shown as such, never a message lost.
    """
    if not headers:
        return
    op = headers.get(operation_header)
    if op is None:
        return
    try:
        key = (int(op), int(headers.get(parked_id_header) or 0))
    except (TypeError, ValueError):
        return
    with _handled_lock:
        _handled.append(key)
    if not flusher_running.is_set():
        flush_handled()


def flush_handled() -> int:
    """Write the handled reports waiting in memory; how many."""
    with _handled_lock:
        batch = _handled[:]
        _handled.clear()
    if not batch:
        return 0
    by_op: dict[int, list[int]] = {}
    for op_id, parked_id in batch:
        by_op.setdefault(op_id, []).append(parked_id)
    try:
        for op_id, ids in by_op.items():
            for start in range(0, len(ids), MAX_STEP):
                RequeueItem.objects.filter(
                    operation_id=op_id,
                    parked_id__in=ids[start : start + MAX_STEP],
                    state__in=(ItemState.SENT, ItemState.PENDING),
                ).update(state=ItemState.HANDLED)
    except Exception:
        logger.warning("could not write %d handled report(s); retrying", len(batch), exc_info=True)
        with _handled_lock:
            _handled[:0] = batch
        return 0
    return len(batch)


def _refresh(op: RequeueOperation) -> None:
    """Sent items whose row is parked again failed again; then the counters."""
    items = RequeueItem.objects.filter(operation=op)
    parked_again = ParkedMessage.objects.filter(
        pk=OuterRef("parked_id"), status=ParkedStatus.PARKED
    )
    items.filter(Exists(parked_again), state=ItemState.SENT).update(state=ItemState.FAILED)
    counts = dict(items.order_by().values_list("state").annotate(n=Count("pk")))
    op.handled = counts.get(ItemState.HANDLED, 0)
    op.failed_again = counts.get(ItemState.FAILED, 0)
    op.refused = counts.get(ItemState.REFUSED, 0)
    op.skipped = counts.get(ItemState.SKIPPED, 0)
    op.sent = counts.get(ItemState.SENT, 0) + op.handled + op.failed_again


def _first_failure(op: RequeueOperation) -> str:
    item = (
        RequeueItem.objects.filter(operation=op, state=ItemState.FAILED)
        .order_by("parked_id")
        .first()
    )
    row = ParkedMessage.objects.filter(pk=item.parked_id).first() if item else None
    if row is None:
        return "a requeued message failed again"
    return f"message #{row.pk} failed again: {row.error_type}: {row.error_message[:200]}"


def _finish(op: RequeueOperation, state: Any, reason: str) -> None:
    op.state, op.state_reason = state, reason
    op.lease_until = None
    op.updated_at = timezone.now()
    op.save()


# ----------------------------------------------------------------------------------------
# Steps


def _batch_size(op: RequeueOperation, now: datetime) -> int:
    """Rows the next step sends. With a rate: half a second's worth, plus what the steps
    fell behind their clock (a step takes time of its own; at most a second is caught up,
    so a pause never turns into a burst)."""
    size = int(app_settings.BATCH_SIZE)
    if op.ramp and op.step < len(RAMP):
        size = min(size, RAMP[op.step])
    if op.rate:
        behind = min(CATCH_UP_SECONDS, max(0.0, (now - op.next_at).total_seconds()))
        size = min(size, max(1, math.ceil(op.rate * (PACE_SECONDS + behind))))
    return size


def advance(op_id: int, *, owner: str | None = None) -> RequeueOperation | None:
    """One step of operation ``op_id`` if it is running, due, and not leased by another
    process; the operation as it is after the step (``None``: not this process's turn)."""
    owner = owner or new_owner()
    now = timezone.now()
    lease = RequeueOperation.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner),
        pk=op_id,
        state=OperationState.RUNNING,
        next_at__lte=now,
    ).update(lease_owner=owner, lease_until=now + timedelta(seconds=LEASE_SECONDS))
    if not lease:
        return None
    op = RequeueOperation.objects.get(pk=op_id)
    try:
        _step(op, now)
    finally:
        RequeueOperation.objects.filter(pk=op.pk, lease_owner=owner).update(lease_until=None)
    return op


def _step(op: RequeueOperation, now: datetime) -> None:
    _refresh(op)
    op.updated_at = now
    waiting = op.sent - op.handled - op.failed_again
    in_canary = 0 < op.sent <= op.canary
    if op.failed_again and (op.stop_on_failure or in_canary):
        what = "The canary failed" if in_canary else "Stopped at the first new failure"
        _finish(op, OperationState.STOPPED, f"{what}: {_first_failure(op)}. The rest stays parked.")
        return
    if waiting and (in_canary or (op.ramp and 0 < op.step <= len(RAMP))):
        # The canary, and each batch of the ramp, wait until their copies are answered.
        stage = "Canary" if in_canary else "Ramp"
        _wait(op, now, f"{stage}: waiting for {waiting} sent message(s) to be handled.")
        return
    size = op.canary - op.sent if op.sent < op.canary else _batch_size(op, now)
    sent = _send(op, min(size, MAX_STEP))
    _refresh(op)
    if sent:
        op.last_sent_at = timezone.now()
        op.started_sending_at = op.started_sending_at or op.last_sent_at
        if op.ramp and op.sent > op.canary:
            op.step += 1
    if not RequeueItem.objects.filter(operation=op, state=ItemState.PENDING).exists():
        waiting = op.sent - op.handled - op.failed_again
        if waiting:
            _wait(op, now, f"All sent; waiting for {waiting} to be handled.")
        elif op.failed_again and op.stop_on_failure:
            _finish(
                op,
                OperationState.STOPPED,
                f"Stopped at the first new failure: {_first_failure(op)}.",
            )
        else:
            _finish(
                op,
                OperationState.DONE,
                f"Done: {op.handled} handled, {op.failed_again} failed again.",
            )
        return
    op.state_reason = "Sending." if sent or not op.state_reason else op.state_reason
    if op.rate and sent:
        # The rate's clock: each step's messages take sent / rate seconds, counted from
        # when the last step was due (no drift), never from long ago (no catch-up burst).
        start = max(op.next_at, now - timedelta(seconds=CATCH_UP_SECONDS))
        op.next_at = start + timedelta(seconds=sent / op.rate)
    elif sent:
        op.next_at = now
    else:  # nothing could be sent now (rows held by another requeue, broker away)
        op.next_at = now + timedelta(seconds=WAIT_SECONDS)
    op.save()


def _wait(op: RequeueOperation, now: datetime, reason: str) -> None:
    op.next_at = now + timedelta(seconds=WAIT_SECONDS)
    op.state_reason = reason
    op.save()


def _send(op: RequeueOperation, size: int) -> int:
    """Publish the next ``size`` pending rows; the items say what became of each."""
    ids = list(
        RequeueItem.objects.filter(operation=op, state=ItemState.PENDING)
        .order_by("parked_id")
        .values_list("parked_id", flat=True)[:size]
    )
    if not ids:
        return 0
    tag = f"{op.created_by} (operation #{op.pk})"[:150]
    items = RequeueItem.objects.filter(operation=op, parked_id__in=ids)
    # A step that died after publishing, before its items were marked: its rows are
    # requeued by this operation; they count as sent, never sent twice.
    mine = ParkedMessage.objects.filter(
        pk__in=ids, status=ParkedStatus.REQUEUED, status_changed_by=tag
    ).values("pk")
    items.filter(parked_id__in=mine, state=ItemState.PENDING).update(state=ItemState.SENT)
    try:
        result = requeue(
            ParkedMessage.objects.filter(pk__in=ids),
            user=tag,
            mode=op.mode,
            headers={header_name(): str(op.pk)},
        )
    except PublishError as exc:
        logger.warning("requeue operation #%s: broker unavailable (%s)", op.pk, exc)
        op.state_reason = f"Broker unavailable, will retry: {exc}"
        if not isinstance(exc, RequeueInterrupted):
            return 0
        result = exc.partial  # what the step did before the broker went away
    # requeued_ids holds every id of a run of at most MAX_STEP rows.
    # Only pending ones: a fast consumer may have reported a copy handled already.
    items.filter(parked_id__in=result.requeued_ids, state=ItemState.PENDING).update(
        state=ItemState.SENT
    )
    if result.failed:
        refused = [int(e.split(":", 1)[0].lstrip("#")) for e in result.errors if e.startswith("#")]
        items.filter(parked_id__in=refused, state=ItemState.PENDING).update(state=ItemState.REFUSED)
    # Rows no longer parked (requeued or discarded by someone else, purged) are skipped;
    # rows another requeue holds stay pending for the next step.
    still_parked = ParkedMessage.objects.filter(
        pk=OuterRef("parked_id"), status=ParkedStatus.PARKED
    )
    items.filter(state=ItemState.PENDING).exclude(Exists(still_parked)).update(
        state=ItemState.SKIPPED
    )
    return len(result.requeued_ids)


def _running(only: int | None) -> QuerySet[RequeueOperation]:
    qs = RequeueOperation.objects.filter(state=OperationState.RUNNING)
    return qs if only is None else qs.filter(pk=only)


def running(*, only: int | None = None) -> bool:
    return _running(only).exists()


def advance_due(*, owner: str | None = None, limit: int = 20, only: int | None = None) -> int:
    """One step of each running operation that is due (``only``: of that one); how many."""
    owner = owner or new_owner()
    due = list(
        _running(only)
        .filter(next_at__lte=timezone.now())
        .order_by("next_at")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(advance(op_id, owner=owner) is not None for op_id in due)


def next_due_in(default: float = 1.0, *, only: int | None = None) -> float:
    """Seconds until the next running operation is due (``default`` when none runs)."""
    nxt = _running(only).order_by("next_at").values_list("next_at", flat=True).first()
    if nxt is None:
        return default
    return max(0.0, min(default, (nxt - timezone.now()).total_seconds()))
