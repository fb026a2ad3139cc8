"""Background requeue operations: canary, ramp, rate, stop at the first new failure.

An operation is a row (:class:`~django_rmq_retry.models.RequeueOperation`) and its
selection, fixed when it is created (one :class:`~django_rmq_retry.models.RequeueItem` per
parked row, written by one ``INSERT ... SELECT``: rows parked later never join). The admin
and ``rmq_requeue`` only create, watch, pause, resume and cancel operations; the consumers'
housekeeping thread or ``manage.py rmq_operations`` advance them with :func:`advance_due`,
one step at a time, one process per operation at a time (a lease on the row, renewed while
a step runs: ``parking.lease``).

A state machine several processes write: every write is one conditional ``UPDATE`` that
says which state it expects, and the row counts say who won.

* An operator's pause, resume and cancel (:func:`pause`, :func:`resume`, :func:`cancel`)
  expect a state and set another; they never touch the lease.
* A step writes only while its lease token is on the row *and* the operation is running:
  a pause or cancel during a step stands, and the step stops at its current batch (whose
  copies are still counted: they were sent).
* Counters move with the items, by the statement that moves them (``F()``); nothing is
  recounted.

Each step publishes through :func:`~django_rmq_retry.parking.requeue` (claims, confirms,
then marks), with a header naming the operation (``parking.stepping``); what became of each
copy comes back through ``parking.outcomes``.

A step sends what the options allow: the canary first (then waits until every canary copy
is handled or failed again), then batches growing 1, 5, 20, 100, ... with ``ramp`` (each
batch waits for its outcome too), paced to ``rate`` messages a second. A resume counts only
the failures after it, and after a stop the canary starts again.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, F, QuerySet, When
from django.utils import timezone

from ..models import (
    ItemState,
    OperationState,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from .outcomes import flush_handled, flusher_running, report_handled
from .requeuing import MODE_RECEIVER, MODE_TOPIC
from .stepping import (
    CATCH_UP_SECONDS,
    HEADER,
    MAX_STEP,
    PACE_SECONDS,
    RAMP,
    WAIT_SECONDS,
    header_name,
    waiting_count,
)
from .stepping import advance as _advance

__all__ = [
    "ACTIONS",
    "ACTIVE",
    "CATCH_UP_SECONDS",
    "HEADER",
    "MAX_STEP",
    "PACE_SECONDS",
    "RAMP",
    "WAIT_SECONDS",
    "Control",
    "EditRefused",
    "Progress",
    "advance",
    "advance_due",
    "cancel",
    "create",
    "create_edit",
    "edit_in_flight",
    "edit_waits",
    "flush_handled",
    "flusher_running",
    "header_name",
    "new_owner",
    "next_due_in",
    "pause",
    "progress",
    "report_handled",
    "resume",
    "running",
]

logger = logging.getLogger("django_rmq_retry.operations")

ACTIVE = (OperationState.RUNNING, OperationState.PAUSED)
#: What an operator may do in each state (the page offers only these).
ACTIONS: dict[Any, tuple[str, ...]] = {
    OperationState.RUNNING: ("pause", "cancel"),
    OperationState.PAUSED: ("resume", "cancel"),
    OperationState.STOPPED: ("resume", "cancel"),
}


def new_owner() -> str:
    """A name for this process's leases on the operations it steps."""
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
        if op.total == 0:
            op.state = OperationState.DONE
            op.state_reason = "Nothing to requeue: no selected message is parked."
        op.save(update_fields=["total", "state", "state_reason"])  # nobody else has it yet
    logger.info("requeue operation #%s created by %s: %d rows", op.pk, user, op.total)
    return op


class EditRefused(ValueError):
    """The edit is not sent; the message says why, for the operator."""


#: The operations an edit may wait in: a paused or stopped one may still send it.
WAITING = (OperationState.RUNNING, OperationState.PAUSED, OperationState.STOPPED)


def edit_in_flight(parked_id: int) -> RequeueOperation | None:
    """The operation that carries an edit of row ``parked_id`` not sent yet, if any."""
    item = (
        RequeueItem.objects.filter(
            parked_id=parked_id,
            edit_body__isnull=False,
            state__in=(ItemState.PENDING, ItemState.SENDING),
            operation__state__in=WAITING,
        )
        .select_related("operation")
        .first()
    )
    return None if item is None else item.operation


def create_edit(
    parked_id: int, *, user: str, body: bytes, headers: dict[str, Any], diff: str
) -> RequeueOperation:
    """A one-row operation that sends ``body`` and ``headers`` in place of the row's (the
    row keeps the original); :class:`EditRefused` if the row is not parked or an edit of
    it waits to be sent. Edit once: the ``rmqr_one_edit`` constraint lets one edit of a row
    wait at a time, so of two submits at once one is refused, whichever database runs."""
    with transaction.atomic():
        # Edits of operations that ended unsent (cancelled) no longer hold the row. A write
        # first: SQLite takes its write lock here, before anything is read.
        RequeueItem.objects.filter(
            parked_id=parked_id,
            edit_body__isnull=False,
            state=ItemState.PENDING,
            operation__state__in=(OperationState.CANCELLED, OperationState.DONE),
        ).update(state=ItemState.SKIPPED)
        waiting = edit_in_flight(parked_id)
        if waiting is not None:
            raise EditRefused(edit_waits(waiting))
        op = create(
            ParkedMessage.objects.filter(pk=parked_id),
            user=user,
            description=f"Edited copy of parked message #{parked_id}",
            stop_on_failure=False,
        )
        if op.total != 1:
            raise EditRefused("Only a parked message can be edited and requeued.")
        try:
            with transaction.atomic():
                RequeueItem.objects.filter(operation=op).update(
                    edit_body=body, edit_headers=headers, edit_diff=diff
                )
        except IntegrityError:  # ``rmqr_one_edit``: another edit of the row won the race
            waiting = edit_in_flight(parked_id)
            raise EditRefused(
                edit_waits(waiting) if waiting else "Another edit of this message was just sent."
            ) from None
    return op


def edit_waits(op: RequeueOperation) -> str:
    """Why an edit is refused while operation ``op`` waits to send an earlier one."""
    return (
        f"An edit of this message waits to be sent by operation #{op.pk} "
        f"({op.get_state_display().lower()}): cancel it to edit again."
    )


@dataclass(frozen=True)
class Control:
    """What an operator's :func:`pause`, :func:`resume` or :func:`cancel` did.

    ``ok``: it took effect (false: the operation's state does not allow it, or there is no
    such operation); ``state``: the operation's state now (``""``: no such operation);
    ``stepping``: a process is in the middle of a step (it holds the lease): after a pause
    or a cancel it stops at its current batch, whose copies are counted as sent;
    ``changed_by``: who set the state it is in now. True when ``ok``.
    """

    ok: bool
    state: str
    stepping: bool
    changed_by: str = ""

    def __bool__(self) -> bool:
        return self.ok


def _control(
    op_id: int, allowed: tuple[Any, ...], user: str, reason: str, **update: Any
) -> Control:
    """One conditional UPDATE from one of the ``allowed`` states; the lease is left alone,
    so a step in flight ends (writing nothing over this) before another may start."""
    now = timezone.now()
    ok = RequeueOperation.objects.filter(pk=op_id, state__in=allowed).update(
        state_reason=reason, state_changed_by=user[:150], updated_at=now, **update
    )
    row = (
        RequeueOperation.objects.filter(pk=op_id)
        .values_list("state", "lease_until", "state_changed_by")
        .first()
    )
    if row is None:
        return Control(False, "", False)
    state, until, by = row
    return Control(bool(ok), state, until is not None and until > timezone.now(), by)


def pause(op_id: int, user: str) -> Control:
    """Pause a running operation: no step starts, the one in flight stops at its batch."""
    return _control(
        op_id, (OperationState.RUNNING,), user, f"Paused by {user}.", state=OperationState.PAUSED
    )


def resume(op_id: int, user: str) -> Control:
    """Resume a paused or stopped operation. Only failures after this count (the ones
    before stay parked, with their new failure, and are not sent again: they had their
    copy), and after a stop the canary starts again from here."""
    now = timezone.now()
    return _control(
        op_id,
        (OperationState.PAUSED, OperationState.STOPPED),
        user,
        f"Resumed by {user}.",
        state=OperationState.RUNNING,
        next_at=now,
        failed_baseline=F("failed_again"),
        canary_from=Case(
            When(state=OperationState.STOPPED, then=F("sent")), default=F("canary_from")
        ),
        last_outcome_at=now,  # the outcome timeout counts from the resume
    )


def cancel(op_id: int, user: str) -> Control:
    """Stop for good: what was not sent stays parked (sent copies are not called back)."""
    return _control(
        op_id,
        (OperationState.RUNNING, OperationState.PAUSED, OperationState.STOPPED),
        user,
        f"Cancelled by {user}.",
        state=OperationState.CANCELLED,
    )


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
    unknown: int  # sent (or maybe sent), no outcome reported in time
    rate: float | None
    achieved_rate: float | None
    updated_at: str
    actions: tuple[str, ...]  # what an operator may do now
    stepping: bool  # a process holds the lease (a step is in flight)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def progress(op: RequeueOperation) -> Progress:
    achieved = None
    if op.started_sending_at and op.last_sent_at and op.sent > 1:
        seconds = (op.last_sent_at - op.started_sending_at).total_seconds()
        if seconds > 0:
            achieved = round((op.sent - 1) / seconds, 2)
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
        left=max(0, op.total - op.sent - op.refused - op.skipped),
        waiting=waiting_count(op),
        unknown=op.unknown,
        rate=op.rate,
        achieved_rate=achieved,
        updated_at=op.updated_at.isoformat(),
        actions=ACTIONS.get(op.state, ()),
        stepping=op.lease_until is not None and op.lease_until > timezone.now(),
    )


def advance(op_id: int, *, owner: str | None = None) -> RequeueOperation | None:
    """One step of operation ``op_id`` if it is running, due, and not leased by another
    step; the operation as it is after the step (``None``: not this process's turn)."""
    return _advance(op_id, owner=owner or new_owner())


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
