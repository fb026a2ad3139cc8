"""Marks: what a requeue run writes once the broker answered a chunk of its copies.

Confirmed rows are marked requeued (only while the run's claim holds, the row is parked and
requeued as many times as read), refused ones released with the reason in their history;
on a thread of their own, a chunk behind the publisher (``parking.requeuing``).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import signals
from ..core.header_budget import too_large_to_requeue
from ..db import locks
from ..db.batches import ids_in
from ..db.threads import start_daemon
from ..models import ParkedClaim, ParkedMessage, ParkedStatus
from .claims import CHUNK_ROWS, Stored, held_by
from .results import IDS_KEPT, MODE_TOPIC, RequeueResult

logger = logging.getLogger("django_rmq_retry.parking")

#: Seconds a bounded run's statement may wait for a lock once its deadline has passed.
LAST_WAIT = 0.1


@dataclass(frozen=True)
class LockWaits:
    """How long one statement of a run may wait for a row lock: ``lock_wait`` seconds, and
    never past the run's ``deadline`` (a ``time.monotonic()`` value); ``None``: no bound.
    ``reported``: the copies name a background operation, whose consumers mark a row once
    its copy is handled, so a bounded mark may leave a row another transaction holds."""

    lock_wait: float | None
    deadline: float | None
    reported: bool = False

    @property
    def bounded(self) -> bool:
        return self.lock_wait is not None or self.deadline is not None

    def seconds(self) -> float | None:
        if not self.bounded:
            return None
        left = [self.lock_wait] if self.lock_wait is not None else []
        if self.deadline is not None:
            # Past the deadline a statement still gets a moment: the run's own last marks.
            left.append(max(LAST_WAIT, self.deadline - time.monotonic()))
        return min(left)


class Marks:
    """Runs ``settle(rows, statuses, lost, refused, result)`` for each published chunk on a thread,
    in order, at most two chunks behind the publisher. ``close`` waits for the last one and
    raises what a settle raised (a database error: the rows it did not mark stay claimed,
    and the caller's release puts them back)."""

    def __init__(
        self,
        settle: Callable[[list[Stored], list[bool], bool, dict[int, str], RequeueResult], None],
        result: Any,
    ) -> None:
        self.settle = settle
        self._result = result
        self._queue: queue.Queue[tuple[list[Stored], list[bool], bool, dict[int, str]] | None]
        self._queue = queue.Queue(2)
        self._error: BaseException | None = None
        self._thread = start_daemon(self._run, "rmq-requeue-marks")

    def submit(
        self, rows: list[Stored], statuses: list[bool], lost: bool, refused: dict[int, str]
    ) -> None:
        self._raise()
        self._queue.put((rows, statuses, lost, refused))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: nothing more is marked after a failure
            try:
                self.settle(*item, self._result)
            except BaseException as exc:  # raised in the caller's thread
                self._error = exc


def refuse_too_large(
    rows: list[tuple[Stored, int]],
    frame_max: int,
    result: RequeueResult,
    token: str,
    using: str,
    waits: LockWaits,
) -> None:
    """Rows whose copy cannot fit a frame: not sent, counted failed, free for another run."""
    ParkedClaim.objects.using(using).filter(
        ids_in([row.pk for row, _size in rows], using), token=token
    ).delete()
    for row, size in rows:
        text = too_large_to_requeue(frame_max, size)
        result.add_refused(row.pk, text)
        note_refusal(row.pk, text, using, waits)


def settle(
    rows: list[Stored],
    statuses: list[bool],
    lost: bool,
    refused_by_broker: dict[int, str],
    result: RequeueResult,
    *,
    token: str,
    user: str,
    mode: str,
    using: str,
    waits: LockWaits,
    held: list[int],
) -> None:
    """Mark the confirmed rows requeued and give the others back; count the ones the broker
    refused (not those a lost connection left unconfirmed: the caller raises for them)."""
    done = [row for row, ok in zip(rows, statuses, strict=True) if ok]
    refused = [row for row, ok in zip(rows, statuses, strict=True) if not ok]
    if done:
        held.extend(mark_requeued(done, token, user, mode, using, result, waits))
    if refused:  # free for the next run
        ParkedClaim.objects.using(using).filter(
            ids_in([row.pk for row in refused], using), token=token
        ).delete()
    for row in refused:
        if row.pk not in refused_by_broker:
            continue
        why = refused_by_broker[row.pk]
        result.add_refused(row.pk, f"the broker refuses it: {why}")
        note_refusal(row.pk, f"the broker refuses it: {why}", using, waits)
    for row in [] if lost else refused:
        if row.pk in refused_by_broker:
            continue
        if mode == MODE_TOPIC:
            text = (
                f"no queue is bound for routing key {row.routing_key!r} (or the broker nacked it)"
            )
        else:
            text = f"the broker refused the message for queue {row.queue!r}"
        result.add_refused(row.pk, text)
        note_refusal(row.pk, text, using, waits)  # an operation's page shows counts only


def note_refusal(pk: int, why: str, using: str, waits: LockWaits) -> None:
    """The row stays parked and says why its copy is refused (an event in its history,
    shown on its admin page): requeueing it again as it is cannot help, and its batch's
    other rows went on without it. A bounded run does not wait for a row another
    transaction holds: the note is left out (the log keeps it)."""
    logger.error("parked message #%s was not requeued: %s", pk, why)
    with transaction.atomic(using=using):
        rows = ParkedMessage.objects.using(using).filter(pk=pk)
        row = rows.select_for_update(skip_locked=waits.bounded).first()
        if row is None:
            return
        event = {
            "at": timezone.now().isoformat(),
            "event": "requeue refused",
            "reason": why[:1000],
        }
        row.history = [*(row.history or []), event][-50:]
        row.save(update_fields=["history"])


def mark_requeued(
    rows: list[Stored],
    token: str,
    user: str,
    mode: str,
    using: str,
    result: RequeueResult,
    waits: LockWaits | None = None,
) -> list[int]:
    """Mark ``rows`` requeued, each only if it is as the run read it: still parked, still
    claimed by this run, requeued as many times as then; the ids left unmarked because
    another transaction held them locked (a bounded run only, see ``requeue``).

    A copy that failed before this mark re-parked its row, counted the requeue and took the
    claim away (``parking.park``); a claim older than the timeout may be another run's by
    now. The requeue count is the condition that holds under a race: the row's own column,
    which PostgreSQL checks again on the row's newest version when this UPDATE had to wait
    for the re-parking (the claim's EXISTS is read from the statement's snapshot).
    """
    waits = waits or LockWaits(None, None)
    now = timezone.now()
    by_count: dict[int, list[int]] = {}
    for row in rows:
        by_count.setdefault(row.requeue_count, []).append(row.pk)
    locked: list[int] = []
    for count, ids in by_count.items():
        for start in range(0, len(ids), CHUNK_ROWS):
            chunk = ParkedMessage.objects.using(using).filter(
                ids_in(ids[start : start + CHUNK_ROWS], using),
                held_by(token, using),
                status=ParkedStatus.PARKED,
                requeue_count=count,
            )
            with transaction.atomic(using=using):
                if waits.bounded and waits.reported and locks.row_locks(using):
                    # The rows no other transaction holds, locked here until the UPDATE;
                    # the others are left to their copy's outcome report. Any other run
                    # waits for its marks: a copy is out, and only its mark keeps the row
                    # from being sent again.
                    free = list(
                        chunk.select_for_update(skip_locked=True, no_key=True).values_list(
                            "pk", flat=True
                        )
                    )
                    locked.extend(set(chunk.values_list("pk", flat=True)) - set(free))
                    chunk = ParkedMessage.objects.using(using).filter(ids_in(free, using))
                chunk.update(
                    status=ParkedStatus.REQUEUED,
                    status_changed_at=now,
                    status_changed_by=user[:150],
                    requeue_count=count + 1,
                )
    if locked:
        logger.warning(
            "requeue: %d confirmed copies whose rows another transaction holds are not "
            "marked now; their claims keep them from being sent again",
            len(locked),
        )
    ids = [row.pk for row in rows]
    result.requeued += len(ids)
    if len(result.requeued_ids) < IDS_KEPT:
        result.requeued_ids.extend(ids[: IDS_KEPT - len(result.requeued_ids)])
    signals.message_requeued.send_robust(
        sender="django_rmq_retry", parked_ids=ids, user=user, mode=mode
    )
    return sorted(locked)
