"""Parking: write a delivery that will not be retried to ``ParkedMessage``, then let it be acked.

Guarantees: :func:`park` and :func:`park_many` commit the row before the caller acks;
parking the same delivery twice (a redelivery after a crash between commit and ack) leaves
one row; a requeued message that fails again returns to its own row, and only to it; a new
failure never merges into a requeued or discarded row, nor into another receiver's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from .. import signals
from ..conf import current_names
from ..core.envelope import Envelope, delivery_digest, read_incoming
from ..core.names import Names
from ..db.batches import insert_rows
from ..models import ParkedClaim, ParkedMessage, ParkedStatus
from . import outcomes
from .rows import json_safe_headers, properties_json, text_column

logger = logging.getLogger("django_rmq_retry.parking")


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
    #: The parking attempt for the row's history (``core.history.record``), if it ran.
    attempt_record: str = ""
    #: An invalid body's failing fields (``[{"loc": [...], "msg": ...}]``), else ``None``.
    field_errors: list[dict[str, Any]] | None = None


def park_key(req: ParkRequest, names: Names) -> str:
    """The idempotency key of a parking: the same delivery parked again finds its row."""
    return _key(req, _envelope(req, names))


def _key(req: ParkRequest, env: Envelope) -> str:
    return delivery_digest(
        req.queue,
        req.properties.get("message_id"),
        req.body,
        str(req.attempts),
        str(env.requeued),
        req.reason,
    )


def _envelope(req: ParkRequest, names: Names) -> Envelope:
    return read_incoming(req.properties.get("headers"), req.exchange, req.routing_key, names)


@dataclass(frozen=True)
class _Prepared:
    """A request turned into the row's columns (shared by ``park`` and ``park_many``)."""

    key: str
    fields: dict[str, Any]
    event: dict[str, Any]
    parked_id: str | None
    requeued: int
    now: datetime
    operation: int | None = None  # the background operation that sent this copy, if any


def _db_time(at: datetime | None) -> datetime | None:
    """``at`` as the database column takes it: aware with ``USE_TZ``, else naive local time.

    The consumer's clock is aware (UTC); without time zones Django's SQLite and MySQL
    backends refuse aware values, which would make every parking fail and the message loop.
    """
    if at is None or settings.USE_TZ or timezone.is_naive(at):
        return at
    return timezone.make_naive(at)


def _prepare(req: ParkRequest, names: Names) -> _Prepared:
    headers = req.properties.get("headers") or {}
    now = timezone.now()
    event = {
        "at": now.isoformat(),
        "event": "parked",
        "reason": req.reason,
        "error_type": text_column(req.error_type),
        "attempts": req.attempts,
    }
    if req.attempt_record:
        event["attempt"] = req.attempt_record
    fields = {
        "receiver": text_column(req.receiver)[:255],
        "queue": text_column(req.queue)[:255],
        "exchange": text_column(req.exchange)[:255],
        "routing_key": text_column(req.routing_key)[:255],
        "message_id": text_column(str(req.properties.get("message_id") or ""))[:255],
        "correlation_id": text_column(str(req.properties.get("correlation_id") or ""))[:255],
        "body": req.body,
        "body_size": len(req.body),
        "content_type": text_column(str(req.properties.get("content_type") or ""))[:255],
        "properties": properties_json(req.properties),
        "headers": json_safe_headers(headers),
        "reason": req.reason,
        "reason_detail": text_column(req.reason_detail),
        "error_type": text_column(req.error_type)[:255],
        "error_message": text_column(req.error_message),
        "traceback": text_column(req.traceback),
        "fingerprint": text_column(req.fingerprint)[:255],
        "attempts": req.attempts,
        "first_failure_at": _db_time(req.first_failure_at),
        "last_failure_at": _db_time(req.last_failure_at),
        "parked_at": now,
        "field_errors": req.field_errors,
    }
    env = _envelope(req, names)
    operation = headers.get(names.header("operation")) if env.parked_id else None
    try:
        op_id = int(operation) if operation is not None else None
    except (TypeError, ValueError):
        op_id = None
    return _Prepared(_key(req, env), fields, event, env.parked_id, env.requeued, now, op_id)


def park(
    req: ParkRequest, *, names: Names | None = None, using: str = "default"
) -> tuple[ParkedMessage, bool]:
    """Write (or re-open) the row for this delivery and commit. Returns (row, created).

    Raises ``DatabaseError`` if the database is unavailable: the caller must then not ack.
    """
    names = names or current_names()
    p = _prepare(req, names)
    if not p.parked_id:
        # The common case, a message parked for the first time: one INSERT (one round trip
        # in autocommit). A duplicate key means this delivery was parked before (a
        # redelivery after a lost ack): fall through to the careful path.
        # Inside a caller's transaction a savepoint keeps it usable after an IntegrityError.
        in_atomic = transaction.get_connection(using).in_atomic_block
        try:
            with transaction.atomic(using=using) if in_atomic else contextlib.nullcontext():
                row = ParkedMessage.objects.using(using).create(
                    park_key=p.key, history=[p.event], **p.fields
                )
        except IntegrityError:
            pass
        else:
            _after_park(row, req, True)
            return row, True
    for _race in range(3):
        try:
            with transaction.atomic(using=using):
                row, created = _place(req, p, using)
        except IntegrityError:
            # Only a racing writer of the same key explains this (another consumer parked
            # this delivery between our lookup and our insert): look again. Anything else
            # (a CHECK, a trigger) is raised, never retried in a loop.
            if not ParkedMessage.objects.using(using).filter(park_key=p.key).exists():
                raise
            continue
        _after_park(row, req, created)
        return row, created
    raise IntegrityError(f"park key {p.key} kept changing under concurrent writers")


def _place(req: ParkRequest, p: _Prepared, using: str) -> tuple[ParkedMessage, bool]:
    """Inside a transaction: find this delivery's row, re-open its requeued row, or create one.

    A row is only ever continued by the story it belongs to. An existing row with the same
    key counts as this delivery's only while it is still *parked* (a redelivery after a
    lost ack, or an identical message, counted); a requeued or discarded row's story is
    over, so its key is retired and this failure gets a row of its own. A requeued copy
    returns to its row only when that row really sent it (:func:`_requeued_row`).
    """
    manager = ParkedMessage.objects.using(using)
    existing = manager.select_for_update().filter(park_key=p.key).order_by().first()
    if existing is not None:
        if existing.status == ParkedStatus.PARKED:
            if not req.redelivered:
                # Not a redelivery: an identical message was parked before. Count it.
                manager.filter(pk=existing.pk).update(park_count=F("park_count") + 1)
            return existing, False
        manager.filter(pk=existing.pk).update(park_key=f"~{existing.pk}")
    row = _requeued_row(p, req, using) if p.parked_id else None
    if row is None:
        return manager.create(park_key=p.key, history=[p.event], **p.fields), True
    # The requeue that sent this copy, told before its return (bulk requeues mark rows
    # without touching their history; the row still names who requeued it, and when).
    requeue_event = {
        "at": row.status_changed_at.isoformat() if row.status_changed_at else "",
        "event": "requeued",
        "by": row.status_changed_by,
    }
    back = [requeue_event] if row.status == ParkedStatus.REQUEUED else []
    for name, value in p.fields.items():
        setattr(row, name, value)
    row.park_key = p.key
    row.status = str(ParkedStatus.PARKED)
    row.status_changed_at = p.now
    row.status_changed_by = ""
    # A copy that failed before its requeue marked the row (still parked, claimed): the
    # requeue happened, so it counts; its claim goes, so the requeue's late mark (made
    # only while the claim holds) leaves the row parked.
    ParkedClaim.objects.using(using).filter(parked_id=row.pk).delete()
    row.requeue_count = max(row.requeue_count, p.requeued)
    row.park_count = row.park_count + 1
    row.history = [*(row.history or []), *back, p.event][-50:]
    row.save()
    if p.operation is not None:  # an operation's copy failed again: its item says so
        outcomes.failed_again(p.operation, row.pk, using)
    return row, False


def _requeued_row(p: _Prepared, req: ParkRequest, using: str) -> ParkedMessage | None:
    """The row a requeued copy came from, locked; ``None`` unless everything agrees.

    Its ``parked-id`` header is a claim, not a fact (forwarded, forged, or a topic requeue
    that reached a sibling): the row must exist, belong to this receiver's queue, hold this
    message (id and body), and be requeued as many times as the copy says (or be mid-way
    through that requeue: the copy can fail before the requeue marks its row). Otherwise
    the failure is a fresh one and gets a row of its own.
    """
    row = (
        ParkedMessage.objects.using(using)
        .select_for_update()
        .filter(pk=int(p.parked_id or 0))
        .first()
    )
    if row is None:
        return None
    if (row.queue, row.receiver, row.message_id) != (
        p.fields["queue"],
        p.fields["receiver"],
        p.fields["message_id"],
    ):
        return None
    requeued = p.requeued
    if row.status == ParkedStatus.REQUEUED:
        if row.requeue_count != requeued:
            return None
    elif row.status != ParkedStatus.PARKED or row.requeue_count + 1 != requeued:
        return None
    elif not ParkedClaim.objects.using(using).filter(parked_id=row.pk).exists():
        return None  # parked and not being requeued: no requeue sent this copy
    return row if bytes(row.body) == req.body else None


def park_many(
    reqs: Sequence[ParkRequest], *, names: Names | None = None, using: str = "default"
) -> list[tuple[int, bool]]:
    """Park a batch with one multi-row INSERT and one commit; (row id, created) in ``reqs``
    order.

    A commit waits for the database's disk, so a consumer that parks a flood of failures one
    commit at a time is bound by fsync, not by work (group commit, as databases do it for
    their own log). The common case, messages parked for the first time, goes in one
    statement (:func:`..batches.insert_rows`); a batch holding a requeued message's return, or
    one that meets an existing key (a redelivery after a lost ack, an identical message),
    is written row by row through :func:`park`, which sorts each case out. Every row is
    committed when this returns; ``DatabaseError`` means none of the batch may be acked.
    No model instance is built unless a ``message_parked`` receiver is connected.
    """
    names = names or current_names()
    prepared = [_prepare(req, names) for req in reqs]
    keys = {p.key for p in prepared}
    if any(p.parked_id for p in prepared) or len(keys) != len(prepared):
        return _one_by_one(reqs, names, using)
    try:
        ids = insert_rows(  # all or nothing, and committed (outside a caller's transaction)
            ParkedMessage,
            [{"park_key": p.key, "history": [p.event], **p.fields} for p in prepared],
            using,
        )
    except IntegrityError:
        return _one_by_one(reqs, names, using)
    if signals.message_parked.has_listeners():
        for pk, p, req in zip(ids, prepared, reqs, strict=True):
            row = ParkedMessage(pk=pk, park_key=p.key, history=[p.event], **p.fields)
            _after_park(row, req, True)
    return [(pk, True) for pk in ids]


def _one_by_one(reqs: Sequence[ParkRequest], names: Names, using: str) -> list[tuple[int, bool]]:
    results = []
    for req in reqs:
        row, created = park(req, names=names, using=using)
        results.append((row.pk, created))
    return results


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
