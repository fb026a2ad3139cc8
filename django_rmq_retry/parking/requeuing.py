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
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from django.db import transaction
from django.db.models import QuerySet

from .. import broker
from ..conf import app_settings, current_names
from ..core.envelope import requeue_properties
from ..core.errors import PublishError
from ..core.header_budget import properties_room
from ..core.names import Names
from ..db.batches import ids_in
from ..models import ParkedClaim, ParkedMessage, ParkedStatus
from ..publishing.per_thread import get_publisher
from .claims import ClaimAhead, Claims, Stored, stale_before
from .marks import LockWaits, Marks, refuse_too_large, settle
from .results import IDS_KEPT, MODE_RECEIVER, MODE_TOPIC, RequeueInterrupted, RequeueResult
from .rows import row_properties

__all__ = [
    "IDS_KEPT",
    "MODE_RECEIVER",
    "MODE_TOPIC",
    "RequeueInterrupted",
    "RequeueResult",
    "requeue",
    "requeue_target",
]

if TYPE_CHECKING:  # the broker package loads pika: only when something is requeued
    from ..broker import Outgoing


class _Target(Protocol):
    @property
    def routing_key(self) -> str: ...

    @property
    def queue(self) -> str: ...


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
    waits = LockWaits(lock_wait, deadline, reported=bool(headers[names.header("operation")]))
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
    settle_chunk = functools.partial(
        settle, token=token, user=user, mode=mode, using=using, waits=waits, held=held
    )
    marks = Marks(settle_chunk, result) if ahead else None
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
                    refuse_too_large(too_large, frame_max, result, token, using, waits)
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
            settle_chunk(rows, statuses, lost, refused, result)
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


#: Requeued messages unconfirmed at once: throughput without a confirm per round trip, and
#: at most this many sent twice when the connection drops mid-requeue. The same as
#: ``send_many``'s window: a smaller one leaves the broker waiting for the next messages
#: while we wait for confirms (see bench/README.md).
REQUEUE_WINDOW = 1000
#: Chunks published and not yet answered at once: the broker always has the next chunk while
#: the last is confirmed, and memory holds a few chunks of ``CHUNK_BYTES`` for any body size.
CHUNKS_IN_FLIGHT = 2


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
