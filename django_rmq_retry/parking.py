"""Parking and its operator actions: park, requeue, discard, purge.

The admin and the management commands both call these functions; neither holds logic of
its own. Guarantees:

* **park** commits the row before the caller acks; parking the same delivery twice (a
  redelivery after a crash between commit and ack) leaves one row.
* **requeue** claims rows with a conditional UPDATE (PostgreSQL adds ``FOR UPDATE SKIP
  LOCKED``), publishes each with confirms, and marks a row requeued only after its publish
  was confirmed. Two operators, or a double click, never requeue a row twice; an
  interrupted run releases its unpublished claims so a rerun skips nothing.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from . import signals
from .conf import app_settings
from .envelope import (
    delivery_digest,
    headers_from_json,
    json_safe_headers,
    read_int_header,
    read_str_header,
    requeue_properties,
)
from .errors import PublishError
from .models import ParkedMessage, ParkedStatus
from .names import Names
from .threads import start_daemon

logger = logging.getLogger("django_rmq_retry.parking")

MODE_RECEIVER = "receiver"  # back to the queue of the receiver it failed in
MODE_TOPIC = "topic"  # to the work exchange with the original routing key (all receivers)


@dataclass(frozen=True)
class ParkRequest:
    """Everything known about a delivery that must be parked (built by the consumer)."""

    receiver: str
    queue: str
    exchange: str
    routing_key: str
    body: bytes
    properties: Mapping[str, Any]  # pika attribute names, headers included
    reason: str
    reason_detail: str
    attempts: int
    redelivered: bool
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    fingerprint: str = ""
    first_failure_at: datetime | None = None
    last_failure_at: datetime | None = None


def park_key(req: ParkRequest, names: Names) -> str:
    headers = req.properties.get("headers") or {}
    requeued = read_int_header(headers, names.header("requeued")) or 0
    return delivery_digest(
        req.queue,
        req.properties.get("message_id"),
        req.body,
        str(req.attempts),
        str(requeued),
        req.reason,
    )


def _text(value: str) -> str:
    """Text for a display/filter column. PostgreSQL refuses NUL characters in text, so they
    are shown as U+FFFD; the exact values live in the ``properties``/``headers`` JSON."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _properties_json(properties: Mapping[str, Any]) -> dict[str, Any]:
    props = {k: v for k, v in properties.items() if k != "headers" and v is not None}
    return json_safe_headers(props)


@dataclass(frozen=True)
class _Prepared:
    """A request turned into the row's columns (shared by ``park`` and ``park_many``)."""

    key: str
    fields: dict[str, Any]
    event: dict[str, Any]
    parked_id: str | None
    now: datetime


def _prepare(req: ParkRequest, names: Names) -> _Prepared:
    headers = req.properties.get("headers") or {}
    now = timezone.now()
    event = {
        "at": now.isoformat(),
        "event": "parked",
        "reason": req.reason,
        "error_type": _text(req.error_type),
        "attempts": req.attempts,
    }
    fields = {
        "receiver": _text(req.receiver)[:255],
        "queue": _text(req.queue)[:255],
        "exchange": _text(req.exchange)[:255],
        "routing_key": _text(req.routing_key)[:255],
        "message_id": _text(str(req.properties.get("message_id") or ""))[:255],
        "correlation_id": _text(str(req.properties.get("correlation_id") or ""))[:255],
        "body": req.body,
        "body_size": len(req.body),
        "content_type": _text(str(req.properties.get("content_type") or ""))[:255],
        "properties": _properties_json(req.properties),
        "headers": json_safe_headers(headers),
        "reason": req.reason,
        "reason_detail": _text(req.reason_detail),
        "error_type": _text(req.error_type)[:255],
        "error_message": _text(req.error_message),
        "traceback": _text(req.traceback),
        "fingerprint": _text(req.fingerprint)[:255],
        "attempts": req.attempts,
        "first_failure_at": req.first_failure_at,
        "last_failure_at": req.last_failure_at,
        "parked_at": now,
    }
    parked_id = read_str_header(headers, names.header("parked-id"))
    return _Prepared(park_key(req, names), fields, event, parked_id, now)


def park(
    req: ParkRequest, *, names: Names | None = None, using: str = "default"
) -> tuple[ParkedMessage, bool]:
    """Write (or re-open) the row for this delivery and commit. Returns (row, created).

    Raises ``DatabaseError`` if the database is unavailable: the caller must then not ack.
    """
    names = names or Names(app_settings.PREFIX)
    p = _prepare(req, names)
    key, fields, event, parked_id, now = p.key, p.fields, p.event, p.parked_id, p.now
    if not parked_id:
        # The common case, a message parked for the first time: one INSERT (one round trip
        # in autocommit). A duplicate key means this delivery was parked before (a
        # redelivery after a lost ack): fall through to the careful path.
        # Inside a caller's transaction a savepoint keeps it usable after an IntegrityError.
        in_atomic = transaction.get_connection(using).in_atomic_block
        try:
            with transaction.atomic(using=using) if in_atomic else contextlib.nullcontext():
                row = ParkedMessage.objects.using(using).create(
                    park_key=key, history=[event], **fields
                )
        except IntegrityError:
            pass
        else:
            _after_park(row, req, True)
            return row, True
    with transaction.atomic(using=using):
        existing = ParkedMessage.objects.using(using).filter(park_key=key).order_by().first()
        if existing is not None:
            if not req.redelivered:
                # Not a redelivery: an identical message was parked before. Count it.
                ParkedMessage.objects.using(using).filter(pk=existing.pk).update(
                    park_count=F("park_count") + 1
                )
            return existing, False
        if parked_id and parked_id.isdigit():
            row = (
                ParkedMessage.objects.using(using)
                .select_for_update()
                .filter(pk=int(parked_id))
                .first()
            )
            if row is not None:
                for name, value in fields.items():
                    setattr(row, name, value)
                row.park_key = key
                row.status = ParkedStatus.PARKED
                row.status_changed_at = now
                row.status_changed_by = ""
                row.claim_token = ""
                row.park_count = row.park_count + 1
                row.history = [*(row.history or []), event][-50:]
                row.save()
                created = False
                _after_park(row, req, created)
                return row, created
        row = ParkedMessage.objects.using(using).create(park_key=key, history=[event], **fields)
        created = True
    _after_park(row, req, created)
    return row, created


def park_many(
    reqs: Sequence[ParkRequest], *, names: Names | None = None, using: str = "default"
) -> list[tuple[ParkedMessage, bool]]:
    """Park a batch with one multi-row INSERT and one commit; results in ``reqs`` order.

    A commit waits for the database's disk, so a consumer that parks a flood of failures one
    commit at a time is bound by fsync, not by work (group commit, as databases do it for
    their own log). The common case, messages parked for the first time, goes in one
    statement; a batch holding a requeued message's return, or one that meets an existing
    key (a redelivery after a lost ack, an identical message), is written row by row
    through :func:`park`, which sorts each case out. Every row is committed when this
    returns; ``DatabaseError`` means none of the batch may be acked.
    """
    names = names or Names(app_settings.PREFIX)
    if len(reqs) <= 1:
        return [park(req, names=names, using=using) for req in reqs]
    prepared = [_prepare(req, names) for req in reqs]
    keys = {p.key for p in prepared}
    if any(p.parked_id for p in prepared) or len(keys) != len(prepared):
        return [park(req, names=names, using=using) for req in reqs]
    try:
        with transaction.atomic(using=using):
            rows = [ParkedMessage(park_key=p.key, history=[p.event], **p.fields) for p in prepared]
            if connections[using].features.can_return_rows_from_bulk_insert:
                ParkedMessage.objects.using(using).bulk_create(rows)
            else:  # the rows need their ids (signals, requeue headers): still one commit
                for row in rows:
                    row.save(force_insert=True, using=using)
            for row, req in zip(rows, reqs, strict=True):
                _after_park(row, req, True)
    except IntegrityError:
        return [park(req, names=names, using=using) for req in reqs]
    return [(row, True) for row in rows]


def stripped_request(req: ParkRequest, refusal: BaseException) -> ParkRequest:
    """A copy of ``req`` any database can store, for a row the database refused.

    The last resort that keeps the message: the body is kept bit for bit (bytes always
    store); the properties and headers the database refused are left out of the row and
    described, escaped, in its reason detail; every text is ASCII-escaped. A requeue of such
    a row publishes the body without its original headers.
    """

    def esc(value: Any, limit: int = 10_000) -> str:
        return ascii(str(value))[1:-1][:limit]

    props = req.properties
    kept = {
        k: esc(v, 255)
        for k, v in props.items()
        if k in ("message_id", "correlation_id", "content_type", "content_encoding", "type")
        and v is not None
    }
    refused = " ".join(str(refusal).split())[:300]
    detail = (
        f"{esc(req.reason_detail, 2000)} [stored without its headers and properties, which "
        f"the database refused ({esc(refused)}); they were: headers {esc(props.get('headers'))}; "
        f"properties {esc({k: v for k, v in props.items() if k != 'headers'})}]"
    )
    return replace(
        req,
        receiver=esc(req.receiver, 255),
        queue=esc(req.queue, 255),
        exchange=esc(req.exchange, 255),
        routing_key=esc(req.routing_key, 255),
        properties={**kept, "headers": {}},
        reason_detail=detail,
        error_type=esc(req.error_type, 255),
        error_message=esc(req.error_message),
        traceback=esc(req.traceback, 100_000),
        fingerprint=esc(req.fingerprint, 255),
    )


def _after_park(row: ParkedMessage, req: ParkRequest, created: bool) -> None:
    def send() -> None:
        for _receiver, result in signals.message_parked.send_robust(
            sender=req.receiver, parked=row, reason=req.reason, created=created
        ):
            if isinstance(result, Exception):
                logger.error("a message_parked signal receiver failed: %r", result)

    transaction.on_commit(send)


# --------------------------------------------------------------------------------------------
# Requeue


@dataclass
class RequeueResult:
    requeued: int = 0
    failed: int = 0
    skipped: int = 0
    matched: int = 0
    errors: list[str] = field(default_factory=list)
    requeued_ids: list[int] = field(default_factory=list)

    def add_error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)


def requeue_target(row: ParkedMessage, mode: str, names: Names) -> tuple[str, str, str | None]:
    """(exchange, routing key, target queue header) for a requeue of ``row``."""
    if mode == MODE_TOPIC:
        return names.work_exchange, row.routing_key, None
    return names.deliver_exchange, "", row.queue


def row_properties(row: ParkedMessage) -> dict[str, Any]:
    props = headers_from_json(row.properties)
    props["headers"] = headers_from_json(row.headers)
    return props


def _claim(ids: list[int], token: str, stale_before: datetime, using: str) -> int:
    claimable = Q(status=ParkedStatus.PARKED) | Q(
        status=ParkedStatus.REQUEUING, claimed_at__lt=stale_before
    )
    manager = ParkedMessage.objects.using(using)
    with transaction.atomic(using=using):
        qs = manager.filter(claimable, pk__in=ids)
        if transaction.get_connection(using).features.has_select_for_update_skip_locked:
            # One statement: UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED).
            locked = qs.order_by().select_for_update(skip_locked=True).values("pk")
            qs = manager.filter(claimable, pk__in=locked)
        return qs.update(
            status=ParkedStatus.REQUEUING, claim_token=token, claimed_at=timezone.now()
        )


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
) -> RequeueResult:
    """Requeue the parked rows of ``queryset`` in batches; memory stays flat for any count."""
    from .publishing import get_publisher

    if mode not in (MODE_RECEIVER, MODE_TOPIC):
        raise ValueError(f"unknown requeue mode {mode!r}")
    names = names or Names(app_settings.PREFIX)
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    using = queryset.db
    result = RequeueResult()
    stale_before = timezone.now() - timedelta(seconds=int(app_settings.REQUEUE_CLAIM_TIMEOUT))
    candidates = queryset.filter(
        Q(status=ParkedStatus.PARKED)
        | Q(status=ParkedStatus.REQUEUING, claimed_at__lt=stale_before)
    ).order_by("pk")
    if dry_run:
        result.matched = candidates.count() if limit is None else min(limit, candidates.count())
        return result
    publisher = publisher or get_publisher()
    token = uuid.uuid4().hex
    claims = _Claims(candidates, token, stale_before, using, batch_size, limit)
    # Claim and load the next batch on a thread of its own while this one is published: the
    # database work and the broker's confirms overlap instead of taking turns. Not inside a
    # caller's transaction: another connection would not see its rows, nor share its locks.
    ahead = not transaction.get_connection(using).in_atomic_block
    feed = _ClaimAhead(claims) if ahead else None
    try:
        for chunk in feed if feed is not None else claims.chunks():
            result.matched += chunk.matched
            result.skipped += chunk.skipped
            if chunk.rows:
                _publish_chunk(chunk.rows, token, user, mode, publisher, names, using, result)
            if progress:
                progress(result)
    except PublishError as exc:
        exc.result = result  # type: ignore[attr-defined]  # what was done before it stopped
        raise
    finally:
        if feed is not None:
            feed.stop()  # no claim is made after this returns
        # Whatever happened (Ctrl-C, broker gone), nothing stays claimed by us unpublished.
        ParkedMessage.objects.using(using).filter(
            claim_token=token, status=ParkedStatus.REQUEUING
        ).update(status=ParkedStatus.PARKED, claim_token="", claimed_at=None)
    return result


#: A requeue batch is published in chunks of at most this many body bytes (bounded memory).
CHUNK_BYTES = 8 * 1024 * 1024
#: Requeued messages unconfirmed at once: throughput without a confirm per round trip, and
#: at most this many sent twice when the connection drops mid-requeue.
REQUEUE_WINDOW = 200


#: The columns a requeue reads to publish a row again (and to say why it failed).
_PUBLISH_FIELDS = (
    "pk",
    "body",
    "body_size",
    "properties",
    "headers",
    "queue",
    "exchange",
    "routing_key",
    "requeue_count",
)


@dataclass
class _Chunk:
    rows: list[ParkedMessage]  # claimed by this run, to publish
    matched: int = 0  # candidates looked at for this chunk's claim
    skipped: int = 0  # of those, claimed by someone else meanwhile


@dataclass
class _Claims:
    """Claims candidates batch by batch and loads the claimed rows in bounded chunks."""

    candidates: QuerySet[ParkedMessage]
    token: str
    stale_before: datetime
    using: str
    batch_size: int
    limit: int | None

    def chunks(self) -> Iterator[_Chunk]:
        claimed_total = 0
        last_pk = 0
        while self.limit is None or claimed_total < self.limit:
            size = (
                self.batch_size
                if self.limit is None
                else min(self.batch_size, self.limit - claimed_total)
            )
            ids = list(self.candidates.filter(pk__gt=last_pk).values_list("pk", flat=True)[:size])
            if not ids:
                return
            last_pk = ids[-1]
            claimed = _claim(ids, self.token, self.stale_before, self.using)
            claimed_total += claimed
            first = _Chunk([], matched=len(ids), skipped=len(ids) - claimed)
            if not claimed:
                yield first
                continue
            rows = (
                ParkedMessage.objects.using(self.using)
                .filter(
                    claim_token=self.token,
                    status=ParkedStatus.REQUEUING,
                    pk__gte=ids[0],
                    pk__lte=ids[-1],
                )
                .only(*_PUBLISH_FIELDS)  # not the traceback, the history, the error text
            )
            chunk, size_bytes = first, 0
            for row in rows.order_by("pk").iterator(chunk_size=200):
                chunk.rows.append(row)
                size_bytes += row.body_size
                if size_bytes >= CHUNK_BYTES or len(chunk.rows) >= 1000:
                    yield chunk
                    chunk, size_bytes = _Chunk([]), 0
            if chunk.rows or chunk is first:
                yield chunk


class _ClaimAhead:
    """Runs ``_Claims.chunks()`` on a daemon thread, one chunk ahead of the publisher."""

    def __init__(self, claims: _Claims) -> None:
        self._claims = claims
        self._queue: queue.Queue[_Chunk | BaseException | None] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = start_daemon(self._run, "rmq-requeue-claims")

    def __iter__(self) -> Iterator[_Chunk]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _run(self) -> None:
        try:
            for chunk in self._claims.chunks():
                if not self._put(chunk):
                    return
            self._put(None)
        except BaseException as exc:  # handed to the caller's thread, raised there
            self._put(exc)

    def _put(self, item: _Chunk | BaseException | None) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def stop(self) -> None:
        """Stop claiming and wait for the thread, so the caller's release sees every claim."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(0.05)


def _publish_chunk(
    rows: list[ParkedMessage],
    token: str,
    user: str,
    mode: str,
    publisher: Any,
    names: Names,
    using: str,
    result: RequeueResult,
) -> None:
    messages = []
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
        messages.append((exchange, routing_key, bytes(row.body), props))
    lost: PublishError | None = None
    try:
        statuses = publisher.publish_raw_many(messages, window=REQUEUE_WINDOW)
    except PublishError as exc:
        lost = exc
        statuses = getattr(exc, "statuses", None) or [False] * len(rows)
    done = [row.pk for row, ok in zip(rows, statuses, strict=True) if ok]
    refused = [row.pk for row, ok in zip(rows, statuses, strict=True) if not ok]
    if done:
        _mark_requeued(done, token, user, mode, using, result)
    if refused:
        ParkedMessage.objects.using(using).filter(pk__in=refused, claim_token=token).update(
            status=ParkedStatus.PARKED, claim_token="", claimed_at=None
        )
    if lost is not None:
        raise lost
    for row, ok in zip(rows, statuses, strict=True):
        if not ok:
            result.failed += 1
            if mode == MODE_TOPIC:
                text = f"no queue is bound for routing key {row.routing_key!r} (or the broker nacked it)"
            else:
                text = f"the broker refused the message for queue {row.queue!r}"
            result.add_error(f"#{row.pk}: {text}")


def _mark_requeued(
    ids: list[int], token: str, user: str, mode: str, using: str, result: RequeueResult
) -> None:
    now = timezone.now()
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        ParkedMessage.objects.using(using).filter(pk__in=chunk, claim_token=token).update(
            status=ParkedStatus.REQUEUED,
            status_changed_at=now,
            status_changed_by=user[:150],
            requeue_count=F("requeue_count") + 1,
            claim_token="",
            claimed_at=None,
        )
    result.requeued += len(ids)
    if len(result.requeued_ids) < 1000:
        result.requeued_ids.extend(ids[: 1000 - len(result.requeued_ids)])
    signals.message_requeued.send_robust(
        sender="django_rmq_retry", parked_ids=ids, user=user, mode=mode
    )


# --------------------------------------------------------------------------------------------
# Discard and purge


def discard(
    queryset: QuerySet[ParkedMessage], *, user: str = "", batch_size: int | None = None
) -> int:
    """Mark parked rows discarded (kept for the record until purged). Returns the count."""
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    total = 0
    last_pk = 0
    base = queryset.filter(status=ParkedStatus.PARKED).order_by("pk")
    while True:
        ids = list(base.filter(pk__gt=last_pk).values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        last_pk = ids[-1]
        changed = (
            ParkedMessage.objects.using(queryset.db)
            .filter(pk__in=ids, status=ParkedStatus.PARKED)
            .update(
                status=ParkedStatus.DISCARDED,
                status_changed_at=timezone.now(),
                status_changed_by=user[:150],
            )
        )
        total += changed
        if changed:
            signals.message_discarded.send_robust(
                sender="django_rmq_retry", parked_ids=ids, user=user
            )
    return total


def purge(
    older_than: timedelta,
    *,
    statuses: Iterable[str] = (str(ParkedStatus.REQUEUED), str(ParkedStatus.DISCARDED)),
    batch_size: int | None = None,
    dry_run: bool = False,
    using: str = "default",
) -> int:
    """Delete rows parked before now - ``older_than`` with one of ``statuses``, in batches."""
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    cutoff = timezone.now() - older_than
    qs = ParkedMessage.objects.using(using).filter(parked_at__lt=cutoff, status__in=list(statuses))
    if dry_run:
        return qs.count()
    total = 0
    while True:
        ids = list(qs.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return total
        total += ParkedMessage.objects.using(using).filter(pk__in=ids).delete()[0]


def summary(queryset: QuerySet[ParkedMessage] | None = None) -> list[dict[str, Any]]:
    """Parked counts grouped by receiver and failure group (like ServicePulse's groups)."""
    from django.db.models import Count, Max, Min

    qs = queryset if queryset is not None else ParkedMessage.objects.all()
    return list(
        qs.filter(status=ParkedStatus.PARKED)
        .values("receiver", "fingerprint", "error_type")
        .annotate(count=Count("id"), first=Min("parked_at"), last=Max("parked_at"))
        .order_by("-count", "receiver")
    )


__all__ = [
    "MODE_RECEIVER",
    "MODE_TOPIC",
    "ParkRequest",
    "RequeueResult",
    "discard",
    "park",
    "purge",
    "requeue",
    "summary",
]
