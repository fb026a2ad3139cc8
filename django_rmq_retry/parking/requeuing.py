"""Requeue: put parked messages back to work, each exactly once.

Rows are claimed (a ``ParkedClaim`` row each: the first run to insert it holds the row;
``parking.claims``), published with confirms, and marked requeued only after the broker
confirmed them and only while the claim holds. Two operators, or a double click, never
requeue a row twice; an interrupted run releases its claims so a rerun skips nothing.
``manage.py rmq_requeue`` and the steps of background operations (which every requeue of
the admin starts) call :func:`requeue`.
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from .. import broker, signals
from ..conf import app_settings, current_names
from ..core.envelope import requeue_properties
from ..core.errors import PublishError
from ..core.header_budget import properties_room, too_large_to_requeue
from ..core.names import Names
from ..db import locks
from ..db.batches import ids_in
from ..db.threads import start_daemon
from ..models import ParkedClaim, ParkedMessage, ParkedStatus
from ..publishing.publisher import get_publisher
from .claims import (
    CHUNK_ROWS,
    ClaimAhead,
    Claims,
    Stored,
    held_by,
    stale_before,
)
from .rows import row_properties

if TYPE_CHECKING:  # the broker package loads pika: only when something is requeued
    from ..broker import Outgoing

logger = logging.getLogger("django_rmq_retry.parking")

MODE_RECEIVER = "receiver"  # back to the queue of the receiver it failed in
MODE_TOPIC = "topic"  # to the work exchange with the original routing key (all receivers)


class _Target(Protocol):
    @property
    def routing_key(self) -> str: ...

    @property
    def queue(self) -> str: ...


#: Ids a result keeps of the rows requeued, and of those refused (a background operation's
#: step sends at most this many, so its result names every row).
IDS_KEPT = 1000


@dataclass
class RequeueResult:
    requeued: int = 0
    failed: int = 0
    skipped: int = 0
    matched: int = 0
    errors: list[str] = field(default_factory=list)  # for people: the first 20
    requeued_ids: list[int] = field(default_factory=list)
    #: Rows counted in ``failed``: refused by the broker, too large, unroutable or nacked.
    refused_ids: list[int] = field(default_factory=list)
    stopped: bool = False  # the deadline came first: matching rows may still be parked

    def add_error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)

    def add_refused(self, pk: int, text: str) -> None:
        """Row ``pk`` is not requeued (it stays parked) and counts as failed, because ``text``."""
        self.failed += 1
        if len(self.refused_ids) < IDS_KEPT:
            self.refused_ids.append(pk)
        self.add_error(f"#{pk}: {text}")


class RequeueInterrupted(PublishError):
    """The broker went away (or stopped answering) during a requeue.

    ``partial`` is what the run did before it stopped: the rows the broker confirmed are
    marked requeued and counted there, the others were released and stay parked (running
    the requeue again continues, and requeues none of them twice).
    """

    partial: RequeueResult

    def __init__(self, message: str, partial: RequeueResult) -> None:
        super().__init__(message)
        self.partial = partial


def requeue_target(row: _Target, mode: str, names: Names) -> tuple[str, str, str | None]:
    """(exchange, routing key, target queue header) for a requeue of ``row``."""
    if mode == MODE_TOPIC:
        return names.work_exchange, row.routing_key, None
    return names.deliver_exchange, "", row.queue


def requeue(
    queryset: QuerySet[ParkedMessage],
    *,
    user: str = "",
    mode: str = MODE_RECEIVER,
    limit: int | None = None,
    batch_size: int | None = None,
    dry_run: bool = False,
    publisher: Any = None,
    progress: Callable[[RequeueResult], None] | None = None,
    names: Names | None = None,
    deadline: float | None = None,
    headers: Mapping[str, Any] | None = None,
    bodies: Mapping[int, bytes] | None = None,
    lock_wait: float | None = None,
) -> RequeueResult:
    """Requeue the parked rows of ``queryset`` in batches; memory stays flat for any count.

    ``deadline`` (a ``time.monotonic()`` value) stops the run at the first batch boundary
    after it, with ``result.stopped`` set: running it again continues, and nothing is ever
    requeued twice. A broker that goes away meanwhile raises :class:`RequeueInterrupted`,
    whose ``partial`` is the result so far.

    Call it outside any transaction of yours. Inside one (``ATOMIC_REQUESTS``, an
    ``atomic`` block) the claims and marks commit only with it, after the copies were
    published: a copy that fails at once meets a row other connections still see parked
    (it then gets a row of its own), a rollback leaves published rows parked (requeued
    again later), and the claims hold their locks until the end. The admin's views opt
    out of ``ATOMIC_REQUESTS`` for this reason.

    ``headers`` are written over each copy's headers (``None`` removes one): a background
    operation marks its copies so the consumer can report their outcome.
    ``bodies`` replaces the body of the rows it names (an operator's edit; the row keeps
    the original).

    ``lock_wait`` bounds every wait for a row another transaction holds locked (an editor's
    ``select_for_update``, a long transaction of yours) to that many seconds, and to what
    is left of ``deadline``; ``None`` and no deadline: waits as long as it takes, as the
    command line always has. Bounded, a row locked when it would be claimed is not waited
    for (PostgreSQL's ``SKIP LOCKED``, and ``lock_timeout`` for the rest): it is left
    parked for the next run (counted skipped). A row locked after its claim, when its
    confirmed copy is marked, is waited for, since only the mark keeps it from being sent
    again; but a background operation's copies (``headers`` name it) report their outcome,
    which marks the row: such a run counts the row requeued, leaves it to that report and
    keeps its claim so no other run sends it meanwhile (until ``REQUEUE_CLAIM_TIMEOUT``).
    SQLite locks no rows: its one wait, for the database's write lock, is bounded by the
    connection's ``timeout`` option.
    """
    if mode not in (MODE_RECEIVER, MODE_TOPIC):
        raise ValueError(f"unknown requeue mode {mode!r}")
    names = names or current_names()
    # A copy names the background operation that sent it, or none (a stale name from an
    # earlier operation's copy would report to that operation).
    headers = {names.header("operation"): None, **(headers or {})}
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    using = queryset.db
    result = RequeueResult()
    candidates = queryset.filter(status=ParkedStatus.PARKED).order_by("pk")
    if dry_run:
        result.matched = candidates.count() if limit is None else min(limit, candidates.count())
        return result
    publisher = publisher or get_publisher()
    token = uuid.uuid4().hex
    ParkedClaim.objects.using(using).filter(claimed_at__lt=stale_before()).delete()
    waits = _LockWaits(lock_wait, deadline, reported=bool(headers[names.header("operation")]))
    claims = Claims(candidates, token, using, batch_size, limit, waits.seconds)
    # Claim and load the next batch on a thread of its own while this one is published: the
    # database work and the broker's confirms overlap instead of taking turns. Not inside a
    # caller's transaction: another connection would not see its rows, nor share its locks.
    ahead = not transaction.get_connection(using).in_atomic_block
    feed = ClaimAhead(claims) if ahead else None
    # Marks (and releases of refused rows) on a thread of their own too, once the chunk's
    # confirms are in: the database writes one chunk's marks while the next is published.
    # Rows whose copy is out but whose mark met a lock: their claims stay (see ``lock_wait``).
    held: list[int] = []
    settle = functools.partial(
        _settle, token=token, user=user, mode=mode, using=using, waits=waits, held=held
    )
    marks = _Marks(settle, result) if ahead else None
    # The chunks flow into one stream of confirms (``Publisher.stream_batches``): the next
    # chunk is written while the broker confirms the last, and each is marked once answered.
    in_flight: collections.deque[list[Stored]] = collections.deque()

    # A copy that cannot fit the connection's frame is refused here: sent, the broker
    # would close the connection (and the chunk's other copies with it) every run.
    frame_max = broker.connection_parameters().frame_max
    room = properties_room(frame_max)

    def batches() -> Iterator[list[Outgoing] | None]:
        for chunk in feed.poll() if feed is not None else claims.chunks():
            if chunk is None:  # the next chunk is still loading
                yield None
                continue
            result.matched += chunk.matched
            result.skipped += chunk.skipped
            if chunk.rows:
                rows, messages, too_large = _messages(
                    chunk.rows, mode, names, headers, room, bodies
                )
                if too_large:
                    _refuse_too_large(too_large, frame_max, result, token, using, waits)
                chunk.rows = []
                if rows:
                    # The marks need no body: only the messages in flight hold one.
                    in_flight.append([row._replace(body=b"") for row in rows])
                    yield messages
            elif progress:
                progress(result)
            if deadline is not None and time.monotonic() >= deadline:
                result.stopped = True
                return

    def answered(batch: Sequence[Outgoing]) -> None:
        rows = in_flight.popleft()
        statuses = [item.confirmed for item in batch]
        lost = any(not item.state for item in batch)  # no answer: the publisher raises
        # Rows the broker refuses for what they carry: kept parked, with the reason.
        refused = {
            row.pk: item.refused for row, item in zip(rows, batch, strict=True) if item.refused
        }
        if marks is not None:
            marks.submit(rows, statuses, lost, refused)
        else:
            settle(rows, statuses, lost, refused, result)
        if progress:
            progress(result)

    try:
        publisher.stream_batches(
            batches(), answered, window=REQUEUE_WINDOW, most=CHUNKS_IN_FLIGHT, deadline=deadline
        )
    except PublishError as exc:
        # What was done before it stopped (the ``finally`` marks the last confirmed rows first).
        raise RequeueInterrupted(str(exc), result) from exc
    finally:
        if feed is not None:
            feed.stop()  # no claim is made after this returns
        if marks is not None:
            marks.close()  # every confirmed row marked before the release below
        # Whatever happened (Ctrl-C, broker gone), nothing stays claimed by us: the rows
        # marked are requeued, the others parked and free for the next run; but rows whose
        # copy is out unmarked (their mark met another transaction's lock).
        ours = ParkedClaim.objects.using(using).filter(token=token)
        (ours.exclude(ids_in(held, using)) if held else ours).delete()
    return result


@dataclass(frozen=True)
class _LockWaits:
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


#: Requeued messages unconfirmed at once: throughput without a confirm per round trip, and
#: at most this many sent twice when the connection drops mid-requeue. The same as
#: ``send_many``'s window: a smaller one leaves the broker waiting for the next messages
#: while we wait for confirms (see bench/README.md).
REQUEUE_WINDOW = 1000
#: Chunks published and not yet answered at once: the broker always has the next chunk while
#: the last is confirmed, and memory holds a few chunks of ``CHUNK_BYTES`` for any body size.
CHUNKS_IN_FLIGHT = 2
#: Seconds a bounded run's statement may wait for a lock once its deadline has passed.
LAST_WAIT = 0.1


class _Marks:
    """Runs ``settle(rows, statuses, lost, refused, result)`` for each published chunk on a thread,
    in order, at most two chunks behind the publisher. ``close`` waits for the last one and
    raises what a settle raised (a database error: the rows it did not mark stay claimed,
    and the caller's release puts them back)."""

    def __init__(
        self,
        settle: Callable[[list[Stored], list[bool], bool, dict[int, str], RequeueResult], None],
        result: Any,
    ) -> None:
        self._settle = settle
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
                self._settle(*item, self._result)
            except BaseException as exc:  # raised in the caller's thread
                self._error = exc


def _messages(
    rows: list[Stored],
    mode: str,
    names: Names,
    headers: Mapping[str, Any] | None = None,
    room: int | None = None,
    bodies: Mapping[int, bytes] | None = None,
) -> tuple[list[Stored], list[Outgoing], list[tuple[Stored, int]]]:
    """The messages that put ``rows`` back to work (see ``core.envelope.requeue_properties``),
    their properties encoded once here: (the rows they are for, the messages, and the rows
    whose properties would take more than ``room`` bytes, with that size). ``bodies``
    replaces the body of the rows it names."""
    sent, messages, too_large = [], [], []
    for row in rows:
        exchange, routing_key, target = requeue_target(row, mode, names)
        props = requeue_properties(
            row_properties(row),
            names=names,
            exchange=row.exchange,
            routing_key=row.routing_key,
            target_queue=target,
            parked_id=row.pk,
            requeue_count=row.requeue_count + 1,
        )
        if headers:
            for key, value in headers.items():
                if value is None:
                    props["headers"].pop(key, None)
                else:
                    props["headers"][key] = value
        wire = broker.encode_properties(props)
        if room is not None and len(wire) > room:
            too_large.append((row, len(wire)))
            continue
        encoded = broker.Encoded(wire, props.get("message_id"))
        body = bodies.get(row.pk, row.body) if bodies else row.body
        messages.append(broker.Outgoing(exchange, routing_key, bytes(body), None, encoded))
        sent.append(row)
    return sent, messages, too_large


def _refuse_too_large(
    rows: list[tuple[Stored, int]],
    frame_max: int,
    result: RequeueResult,
    token: str,
    using: str,
    waits: _LockWaits,
) -> None:
    """Rows whose copy cannot fit a frame: not sent, counted failed, free for another run."""
    ParkedClaim.objects.using(using).filter(
        ids_in([row.pk for row, _size in rows], using), token=token
    ).delete()
    for row, size in rows:
        text = too_large_to_requeue(frame_max, size)
        result.add_refused(row.pk, text)
        _note_refusal(row.pk, text, using, waits)


def _settle(
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
    waits: _LockWaits,
    held: list[int],
) -> None:
    """Mark the confirmed rows requeued and give the others back; count the ones the broker
    refused (not those a lost connection left unconfirmed: the caller raises for them)."""
    done = [row for row, ok in zip(rows, statuses, strict=True) if ok]
    refused = [row for row, ok in zip(rows, statuses, strict=True) if not ok]
    if done:
        held.extend(_mark_requeued(done, token, user, mode, using, result, waits))
    if refused:  # free for the next run
        ParkedClaim.objects.using(using).filter(
            ids_in([row.pk for row in refused], using), token=token
        ).delete()
    for row in refused:
        if row.pk not in refused_by_broker:
            continue
        why = refused_by_broker[row.pk]
        result.add_refused(row.pk, f"the broker refuses it: {why}")
        _note_refusal(row.pk, f"the broker refuses it: {why}", using, waits)
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
        _note_refusal(row.pk, text, using, waits)  # an operation's page shows counts only


def _note_refusal(pk: int, why: str, using: str, waits: _LockWaits) -> None:
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


def _mark_requeued(
    rows: list[Stored],
    token: str,
    user: str,
    mode: str,
    using: str,
    result: RequeueResult,
    waits: _LockWaits | None = None,
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
    waits = waits or _LockWaits(None, None)
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
