"""Steps of background requeue operations, each fenced by the step's lease.

The process that holds an operation's lease (``parking.lease``) steps it: sends the next
batch the options allow, or waits for outcomes, or finishes. Every write here is one
conditional ``UPDATE`` that requires the step's lease token, and all but the batch's own
counts require the operation to be running: an operator's pause or cancel during a step
stands, and the step stops at its current batch.

Before it publishes, a step fences its batch (items ``sending``, only while its lease holds
and the operation runs). A process that takes over an operation whose stepper died (or
froze past its lease) looks at what each such item's row says. A requeue run claims a row
before it publishes its copy and keeps the claim until the row is marked requeued
(``parking.claims``), so a row still parked with no claim never reached the broker: its item
goes back to pending and is sent by the taker. Any other item's copy may be out: it counts
as sent and is never sent again; its outcome is reported like any other
(``parking.outcomes``), and copies with no outcome for ``OPERATION_OUTCOME_TIMEOUT`` seconds
count as "outcome unknown", so no wait lasts for ever.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..conf import app_settings, current_names
from ..core.errors import PublishError
from ..db import locks
from ..models import (
    ItemState,
    OperationState,
    ParkedClaim,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from . import lease
from .outcomes import operation_tag
from .requeuing import IDS_KEPT, RequeueInterrupted, RequeueResult, requeue

logger = logging.getLogger("django_rmq_retry.operations")

#: The ramp's batch sizes; past the last one, ``BATCH_SIZE`` rows a step.
RAMP = (1, 5, 20, 100, 500)
#: A paced step sends at most this many seconds' worth of the rate (smooth, not bursty).
PACE_SECONDS = 0.5
#: Seconds of lag a paced step may catch up: a step this late or less sends what it is
#: behind. A later step (its stepper was frozen, paused by the host, or picked the operation
#: up late) starts the rate's clock again from now and makes up for nothing, so a 1 s window
#: at the receiver holds at most ``rate * (1 + PACE_SECONDS + CATCH_UP_SECONDS)`` copies.
CATCH_UP_SECONDS = 0.25
#: Seconds between two steps of an operation waiting for outcomes.
WAIT_SECONDS = 0.5
#: Rows a step sends at most: every id of a step comes back in its ``RequeueResult``.
MAX_STEP = 1000
assert MAX_STEP <= IDS_KEPT
#: The header (under the prefix) naming the operation on a requeued copy.
HEADER = "operation"
#: Seconds a step's statement may wait for a row another transaction holds locked (an
#: editor's ``select_for_update``, a long transaction). A row locked when the step would
#: claim it is left pending for the next step (``requeue``'s ``lock_wait``), so a step never
#: waits on another transaction for longer than this.
LOCK_WAIT = 5.0


def header_name() -> str:
    return current_names().header(HEADER)


def waiting_count(op: RequeueOperation) -> int:
    return max(0, op.sent - op.handled - op.failed_again - op.unknown)


def _first_failure(op: RequeueOperation) -> str:
    """The newest failure of the operation's copies (after a resume, the one that stopped
    it again, not one from before the resume): a re-park sets the row's ``parked_at``."""
    failed = RequeueItem.objects.filter(operation=op, state=ItemState.FAILED).values("parked_id")
    row = (
        ParkedMessage.objects.filter(pk__in=failed)
        .only("pk", "error_type", "error_message")
        .order_by("-parked_at", "-pk")
        .first()
    )
    if row is None:
        return "a requeued message failed again"
    return f"message #{row.pk} failed again: {row.error_type}: {row.error_message[:200]}"


def _fenced(op_id: int, mine: str) -> QuerySet[RequeueOperation]:
    """The operation, if it is running and this step still holds its lease."""
    return RequeueOperation.objects.filter(pk=op_id, lease_owner=mine, state=OperationState.RUNNING)


def _finish(op: RequeueOperation, mine: str, state: Any, reason: str) -> None:
    _fenced(op.pk, mine).update(state=state, state_reason=reason, updated_at=timezone.now())


def _wait(op: RequeueOperation, mine: str, now: datetime, reason: str) -> None:
    _fenced(op.pk, mine).update(
        next_at=now + timedelta(seconds=WAIT_SECONDS), state_reason=reason, updated_at=now
    )


def _lag(op: RequeueOperation, now: datetime) -> float:
    """Seconds this step is behind the rate's clock that it may catch up: a step takes time
    of its own and wakes a little late. Beyond ``CATCH_UP_SECONDS`` the lag is a stall, not
    lateness: catching it up would send the lost seconds at once, a burst at the receiver."""
    lag = (now - op.next_at).total_seconds()
    return lag if 0.0 < lag <= CATCH_UP_SECONDS else 0.0


def _batch_size(op: RequeueOperation, now: datetime) -> int:
    """Rows the next step sends. With a rate: half a second's worth, plus the lag it may
    catch up (``_lag``)."""
    size = int(app_settings.BATCH_SIZE)
    if op.ramp and op.step < len(RAMP):
        size = min(size, RAMP[op.step])
    if op.rate:
        size = min(size, max(1, math.ceil(op.rate * (PACE_SECONDS + _lag(op, now)))))
    return size


def advance(op_id: int, *, owner: str) -> RequeueOperation | None:
    """One step of operation ``op_id`` if it is running, due, and not leased by another
    step; the operation as it is after the step (``None``: not this process's turn)."""
    mine = lease.token(owner)
    now = timezone.now()
    with transaction.atomic():
        won = RequeueOperation.objects.filter(
            Q(lease_until__isnull=True) | Q(lease_until__lt=now),
            pk=op_id,
            state=OperationState.RUNNING,
            next_at__lte=now,
        ).update(lease_owner=mine, lease_until=now + lease.until())
        if not won:
            return None
        _take_over(op_id, now)
    keeper = lease.Keeper(op_id, mine)
    keeper.start()
    try:
        _step(RequeueOperation.objects.get(pk=op_id), mine, now)
    finally:
        keeper.stop()
        RequeueOperation.objects.filter(pk=op_id, lease_owner=mine).update(lease_until=None)
    return RequeueOperation.objects.get(pk=op_id)


def _take_over(op_id: int, now: datetime) -> None:
    """Items a step fenced and never settled (it died, or froze past its lease).

    Their rows tell which copies cannot be out (see the module's docstring): a row still
    parked that no requeue run claims was never published, so its item is pending again
    (counting it sent would wait ``OPERATION_OUTCOME_TIMEOUT`` for an outcome that never
    comes, and leave the row parked). The others count as sent and wait for their outcome
    (a handled report marks the row requeued), never sent again.
    """
    stuck = RequeueItem.objects.filter(operation_id=op_id, state=ItemState.SENDING)
    unsent = stuck.filter(
        Exists(ParkedMessage.objects.filter(pk=OuterRef("parked_id"), status=ParkedStatus.PARKED))
    ).exclude(Exists(ParkedClaim.objects.filter(parked_id=OuterRef("parked_id"))))
    back = unsent.update(state=ItemState.PENDING)
    n = stuck.update(state=ItemState.SENT)
    if back:
        logger.warning(
            "requeue operation #%s: %d copies of a dead step never reached the broker; "
            "sending them now",
            op_id,
            back,
        )
    if n:
        logger.warning("requeue operation #%s: %d copies of a dead step counted sent", op_id, n)
        RequeueOperation.objects.filter(pk=op_id).update(sent=F("sent") + n, last_outcome_at=now)


def _overdue(op: RequeueOperation, now: datetime) -> bool:
    """No outcome reported for ``OPERATION_OUTCOME_TIMEOUT`` since the last one (or the
    last send, or the resume)."""
    since = max((t for t in (op.last_outcome_at, op.last_sent_at) if t), default=None)
    timeout = float(app_settings.OPERATION_OUTCOME_TIMEOUT)
    return since is not None and (now - since).total_seconds() > timeout


def _give_up_waiting(op: RequeueOperation, mine: str) -> int:
    """The copies still waiting count as "outcome unknown" (a late report still counts)."""
    with transaction.atomic():
        if not _fenced(op.pk, mine).update(updated_at=timezone.now()):
            return 0
        n = RequeueItem.objects.filter(operation=op, state=ItemState.SENT).update(
            state=ItemState.UNKNOWN
        )
        RequeueOperation.objects.filter(pk=op.pk).update(unknown=F("unknown") + n)
    return n


def _step(op: RequeueOperation, mine: str, now: datetime) -> None:
    failed = op.failed_again - op.failed_baseline  # a resume goes on past older failures
    in_canary = op.canary > 0 and op.canary_from < op.sent <= op.canary_from + op.canary
    if failed > 0 and (op.stop_on_failure or in_canary):
        what = "The canary failed" if in_canary else "Stopped at the first new failure"
        reason = f"{what}: {_first_failure(op)}. The rest stays parked."
        _finish(op, mine, OperationState.STOPPED, reason)
        return
    waiting = waiting_count(op)
    if waiting and (in_canary or (op.ramp and 0 < op.step <= len(RAMP))):
        # The canary, and each batch of the ramp, wait until their copies are answered.
        stage = "Canary" if in_canary else "Ramp"
        if _overdue(op, now):
            n = _give_up_waiting(op, mine)
            timeout = float(app_settings.OPERATION_OUTCOME_TIMEOUT)
            reason = (
                f"{stage}: no outcome reported for {n} sent message(s) in {timeout:g} s "
                f"(is a consumer of their queue running?). Resume to go on."
            )
            _finish(op, mine, OperationState.STOPPED, reason)
        else:
            _wait(op, mine, now, f"{stage}: waiting for {waiting} sent message(s) to be handled.")
        return
    canary_left = op.canary_from + op.canary - op.sent if op.canary else 0
    size = canary_left if canary_left > 0 else _batch_size(op, now)
    done = _send(op, mine, min(size, MAX_STEP))
    if done is None:
        return  # paused, cancelled or taken over meanwhile: nothing more is written
    sent, problem = done
    op.refresh_from_db()
    if not RequeueItem.objects.filter(operation=op, state=ItemState.PENDING).exists():
        _end(op, mine, now)
        return
    if op.rate and sent:
        # The rate's clock: each step's messages take sent / rate seconds, counted from
        # when this step was due if it was only late (no drift), from now after a stall
        # (no catch-up burst).
        start = now - timedelta(seconds=_lag(op, now))
        next_at = start + timedelta(seconds=sent / op.rate)
    elif sent:
        next_at = now
    else:  # nothing could be sent now (rows held by another requeue, broker away)
        next_at = now + timedelta(seconds=WAIT_SECONDS)
    ramped = op.ramp and sent > 0 and op.sent > op.canary_from + op.canary
    _fenced(op.pk, mine).update(
        next_at=next_at,
        step=F("step") + (1 if ramped else 0),
        state_reason=problem or ("Sending." if sent or not op.state_reason else op.state_reason),
        updated_at=now,
    )


def _end(op: RequeueOperation, mine: str, now: datetime) -> None:
    """Everything is sent (or refused, skipped): wait for the outcomes, then finish."""
    waiting = waiting_count(op)
    if waiting and not _overdue(op, now):
        _wait(op, mine, now, f"All sent; waiting for {waiting} to be handled.")
        return
    if waiting:
        _give_up_waiting(op, mine)
        op.refresh_from_db()
    if op.failed_again - op.failed_baseline > 0 and op.stop_on_failure:
        reason = f"Stopped at the first new failure: {_first_failure(op)}."
        _finish(op, mine, OperationState.STOPPED, reason)
        return
    unknown = f", {op.unknown} without a reported outcome" if op.unknown else ""
    refused = (
        f", {op.refused} refused by the broker (each one's history says why)" if op.refused else ""
    )
    reason = f"Done: {op.handled} handled, {op.failed_again} failed again{unknown}{refused}."
    _finish(op, mine, OperationState.DONE, reason)


def _send(op: RequeueOperation, mine: str, size: int) -> tuple[int, str] | None:
    """Publish the next ``size`` pending rows: (copies sent, the broker's problem if any),
    or ``None`` if the step may no longer send (paused, cancelled, lease lost)."""
    items = RequeueItem.objects.filter(operation=op)
    ids = list(
        items.filter(state=ItemState.PENDING)
        .order_by("parked_id")
        .values_list("parked_id", flat=True)[:size]
    )
    if not ids:
        return 0, ""
    # The fence: the batch is ours to publish only while the lease and the state hold.
    with transaction.atomic():
        if not _fenced(op.pk, mine).update(lease_until=timezone.now() + lease.until()):
            return None
        items.filter(parked_id__in=ids, state=ItemState.PENDING).update(state=ItemState.SENDING)
    problem = ""
    result = RequeueResult()
    edits = {
        pk: (bytes(body), headers or {}, diff or "")
        for pk, body, headers, diff in items.filter(
            parked_id__in=ids, edit_body__isnull=False
        ).values_list("parked_id", "edit_body", "edit_headers", "edit_diff")
    }
    # The plain rows in one run, each edited row in a run of its own (its own headers).
    runs: list[tuple[list[int], dict[str, Any], dict[int, bytes] | None]]
    runs = [([pk for pk in ids if pk not in edits], {}, None)]
    runs += [([pk], headers, {pk: body}) for pk, (body, headers, _diff) in edits.items()]
    try:
        for run_ids, extra, bodies in runs:
            if run_ids:
                result.add(_run(op, run_ids, extra, bodies))
    except PublishError as exc:
        logger.warning("requeue operation #%s: broker unavailable (%s)", op.pk, exc)
        problem = f"Broker unavailable, will retry: {exc}"
        # What the step did before the broker went away (confirmed rows are marked).
        if isinstance(exc, RequeueInterrupted):
            result.add(exc.partial)
    for pk in result.requeued_ids:
        if pk in edits:
            _note_edited(pk, op.created_by, edits[pk][2])
    if result.skipped and not problem:
        problem = (
            f"{result.skipped} message(s) held by another requeue or transaction: "
            "tried again at the next step."
        )
    sent = _settle(op, mine, ids, result)
    return None if sent is None else (sent, problem)


def _run(
    op: RequeueOperation,
    ids: list[int],
    headers: dict[str, Any],
    bodies: dict[int, bytes] | None,
) -> RequeueResult:
    return requeue(
        ParkedMessage.objects.filter(pk__in=ids),
        user=operation_tag(op.created_by, op.pk),
        mode=op.mode,
        headers={**headers, header_name(): str(op.pk)},
        bodies=bodies,
        lock_wait=LOCK_WAIT,
    )


def _note_edited(pk: int, by: str, diff: str) -> None:
    """The row's history says its edited copy went out: who edited it, and what changed."""
    event = {"at": timezone.now().isoformat(), "event": "edited", "by": by, "diff": diff[:8000]}
    try:
        with locks.bounded("default", LOCK_WAIT):
            row = ParkedMessage.objects.select_for_update().filter(pk=pk).only("history").first()
            if row is not None:
                row.history = [*(row.history or []), event][-50:]
                row.save(update_fields=["history"])
    except DatabaseError as exc:
        if not locks.timed_out(exc):
            raise
        # Not waited for (a step never waits long on another transaction): the log keeps it.
        logger.warning("parked message #%s: edited copy sent by %s; history not written", pk, by)


def _settle(op: RequeueOperation, mine: str, ids: list[int], result: RequeueResult) -> int | None:
    """The batch's items say what became of each row, and the counters move with them
    (fenced by the lease alone: a batch sent before a pause still counts). An item a report
    moved meanwhile (handled, failed again) was counted sent by that report."""
    now = timezone.now()
    with transaction.atomic():
        if not RequeueOperation.objects.filter(pk=op.pk, lease_owner=mine).update(updated_at=now):
            # Taken over: the new holder settled these items from their rows.
            logger.warning(
                "requeue operation #%s: this step lost its lease before it could count its "
                "batch of %d; the process that took the operation over counts it",
                op.pk,
                len(ids),
            )
            return None
        items = RequeueItem.objects.filter(operation=op, parked_id__in=ids, state=ItemState.SENDING)
        sent = items.filter(parked_id__in=result.requeued_ids).update(state=ItemState.SENT)
        refused = items.filter(parked_id__in=result.refused_ids).update(state=ItemState.REFUSED)
        # Rows no longer parked (requeued or discarded by someone else, purged) are skipped;
        # rows another requeue holds, or the broker did not confirm, wait for the next step.
        parked = ParkedMessage.objects.filter(pk=OuterRef("parked_id"), status=ParkedStatus.PARKED)
        skipped = items.exclude(Exists(parked)).update(state=ItemState.SKIPPED)
        items.update(state=ItemState.PENDING)
        counters: dict[str, Any] = {
            "sent": F("sent") + sent,
            "refused": F("refused") + refused,
            "skipped": F("skipped") + skipped,
        }
        if sent:
            counters.update(
                last_sent_at=now, started_sending_at=Coalesce("started_sending_at", now)
            )
        RequeueOperation.objects.filter(pk=op.pk).update(**counters)
    # Copies out this step (some may be counted by their outcome already: the rate's clock).
    return len(result.requeued_ids)
