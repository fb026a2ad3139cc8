"""Publishing the outbox: committed rows to the broker, deleted only once it confirmed them.

One *round* is one database transaction: lock the oldest pending rows (``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, so several relays share the work without publishing a row twice),
publish them pipelined with confirms, delete the confirmed ones, and count a refusal
(unroutable, nacked) against the rows the broker refused. A relay killed mid-round rolls
back: its rows are published again by the next round, with the same message ids (the only
duplicates the outbox makes). An unreachable broker leaves the rows untouched and raises.
A row the broker refuses for what it carries (a ``user_id`` that is not the relay's login,
properties too large for a frame: it closes the channel or the connection) is no outage: the
publisher finds it, the round holds it at once with the broker's reason, and the rows after
it flow.

Order: the rows one transaction wrote for one topic are published in the order written. A
round leaves a row whose transaction has an earlier row of the same topic still pending
that the round does not hold: backing off after a refusal (*deferred*: it waits with it),
or locked by another relay's round (*waiting*: due as soon as that round ends, so the next
round starts from the oldest row again instead of going on after this one's last). The
earlier row may lie before the round's first row of that key (``_overtaking``) or among its
own rows: rows are locked as they are read, skipping locked ones, so another round can hold
a stretch in the middle of a big transaction (``_gaps``). Once held back, a key stays held
back for the rest of the round.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.db.models import Case, F, QuerySet, When
from django.utils import timezone

from .. import broker
from ..conf import app_settings
from ..core.json_columns import headers_from_json
from ..db.batches import ids_in
from ..models import OutboxMessage, OutboxStatus
from ..publishing.per_thread import get_publisher
from ..publishing.publisher import Publisher, PublishOutcome

logger = logging.getLogger("django_rmq_retry.outbox")

#: Set after every commit that wrote outbox rows: a relay in this process wakes at once.
relay_wakeup = threading.Event()
#: Set once this process wrote an outbox row (the in-memory test broker relays only then,
#: so tests that never touch the outbox need no database).
rows_written = threading.Event()

#: (transaction, topic): the rows that must leave in the order they were written.
_Key = tuple[str, str]

#: Seconds a drain pauses before looking again for rows another relay's round held up.
WAITING_PAUSE = 0.05

#: Rows turned into messages at once within a round (the broker works on the last chunk
#: while the next is read).
CHUNK = 500

#: Rows a database ``FETCH`` returns at once (and the first chunk of a round: the broker
#: waits for it, so it is small).
FETCH = 100

#: Chunks a round reads ahead of the one being published (PostgreSQL, see ``_read_ahead``).
READ_AHEAD = 2

#: Seconds a refused row waits before its next attempt: doubling from this, capped below.
REFUSED_FIRST_DELAY = 1.0
REFUSED_MAX_DELAY = 300.0


class _Row(NamedTuple):
    """The columns a round needs (no model instances: the relay's hot path)."""

    id: int
    group: str
    exchange: str
    routing_key: str
    body: bytes
    message_id: str
    #: The properties as the sender encoded them (``None`` on rows from before that:
    #: ``properties`` then holds them, as JSON; it is not read otherwise).
    wire_properties: bytes | None
    properties: dict[str, Any] | None
    attempts: int


#: Rows read at once and the messages they become.
_Chunk = list[tuple[_Row, "broker.Outgoing"]]  # a string: pika loads on first use


class _Claim(NamedTuple):
    """What a round keeps of a row it published until the broker answered (not the body)."""

    id: int
    attempts: int


@dataclass(frozen=True)
class RelayRound:
    """What one round did: rows published (and deleted), refused by the broker, newly held."""

    published: int = 0
    refused: int = 0
    held: int = 0
    #: Rows locked this round (a full batch means more may be waiting).
    claimed: int = 0
    #: The highest row id this round read: the next round of a drain starts after it.
    last_id: int | None = None
    #: Rows left because an earlier row of their transaction and topic was in another
    #: relay's round: the next round must look again from the oldest row.
    waiting: int = 0
    #: The round locked as many rows as it may (more may be pending after ``last_id``).
    full: bool = False


def publish_pending(
    *,
    using: str = "default",
    group: str | None = None,
    limit: int | None = None,
    after: int | None = None,
    publisher: Publisher | None = None,
) -> RelayRound:
    """Publish one batch of pending rows (only ``group``'s if given, only those above id
    ``after`` if given); see the module docstring.

    ``after`` is for the rounds of one drain (:func:`publish_all`): the rows below the last
    round's are deleted ones, whose index entries stay until the table is vacuumed, and a
    scan from the lowest id would walk over every one of them again each round.

    Raises ``PublishError`` when the broker could not be reached; rows it confirmed before
    that are deleted all the same.
    """
    limit = limit or int(app_settings.OUTBOX_BATCH_SIZE)
    with transaction.atomic(using=using):
        _write_lock_first(using)
        now = timezone.now()
        rows = _lock_due_rows(using, now, after=after, limit=limit, group=group)
        first = _messages(itertools.islice(rows, FETCH))
        if not first:  # nothing due: no broker connection needed
            return RelayRound()
        chunks: Iterator[_Chunk] = iter(lambda: _messages(itertools.islice(rows, CHUNK)), [])
        if connections[using].vendor == "postgresql":
            chunks = _read_ahead(chunks)
        claimed: dict[int, _Claim] = {}  # id(Outgoing) -> its row's id and attempts
        firsts: dict[_Key, int] = {}  # each (transaction, topic)'s first row in this round
        clear: set[_Key] = set()  # keys found with no earlier row this round does not hold
        last: dict[_Key, int] = {}  # each key's last row published by this round
        stopped: set[_Key] = set()  # keys waiting for a row this round does not hold
        put_off: set[_Key] = set()  # keys waiting for a row backing off after a refusal
        read = [0, 0, 0]  # rows locked this round (left ones included), the last id, waiting

        def outgoing() -> Generator[broker.Outgoing, None, None]:
            """The round's rows as messages, read a chunk at a time while the broker works
            on the previous chunk; a row with an earlier row of its transaction and topic
            this round does not hold is left where it is (``_overtaking``, ``_gaps``)."""
            for chunk in itertools.chain([first], chunks):
                read[0] += len(chunk)
                read[1] = chunk[-1][0].id
                for row, _item in chunk:
                    firsts.setdefault(_key(row), row.id)
                waiting, deferred = _overtaking(chunk, firsts, clear, now, using)
                # Held back once, a key stays so for the rest of the round: its rows locked
                # in this chunk stay unpublished, and a later chunk's must not overtake them.
                stopped.update(waiting)
                put_off.update(deferred)
                held_back = stopped | put_off
                gaps = _gaps([row for row, _ in chunk if _key(row) not in held_back], last, using)
                for row, item in chunk:
                    key = _key(row)
                    if row.id >= gaps.get(key, row.id + 1):
                        stopped.add(key)  # a row of its span is not ours: the rest waits
                    if key in stopped:
                        read[2] += 1
                        continue
                    if key in put_off:
                        continue
                    last[key] = row.id
                    claimed[id(item)] = _Claim(row.id, row.attempts)
                    yield item

        stream = outgoing()
        try:
            outcome = (publisher or get_publisher()).stream_items(stream)
        finally:  # a stream stopped early: its reader, then its cursor, before the DELETE
            for iterator in (stream, chunks, rows):
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        # Rows without an answer (the stream stopped: ``outcome.error``) stay as they are.
        published, refused, held = _settle(claimed, outcome, now, using)
    if outcome.error is not None:
        raise outcome.error
    return RelayRound(published, refused, held, read[0], read[1] or None, read[2], read[0] >= limit)


def _lock_due_rows(
    using: str,
    now: datetime,
    *,
    after: int | None,
    limit: int,
    group: str | None = None,
    fetch: int = FETCH,
) -> Iterator[tuple[Any, ...]]:
    """The due pending rows above id ``after``, oldest first, each locked as it is read
    (skipping rows another relay's round holds), ``fetch`` rows per database round trip."""
    pending = OutboxMessage.objects.using(using).filter(
        status=OutboxStatus.PENDING, available_at__lte=now
    )
    if group is not None:
        pending = pending.filter(group=group)
    if after is not None:
        pending = pending.filter(id__gt=after)
    if connections[using].vendor == "postgresql":
        # Lock the round's rows in one statement first: read FETCH by FETCH, another relay's
        # round can take rows between two of this round's reads, and a big transaction then
        # ends up split between rounds that each stop at the other's stretch (``_gaps``).
        ids = list(
            pending.select_for_update(skip_locked=True)
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return iter(())
        pending = pending.filter(id__gte=ids[0], id__lte=ids[-1])
    # The JSON copy of the properties only where no encoded one is stored: decoding it is
    # CPU spent on every row, and a row with the encoded copy never needs it.
    legacy = Case(When(wire_properties__isnull=True, then=F("properties")), default=None)
    return (
        pending.select_for_update(skip_locked=True)
        .annotate(legacy_properties=legacy)
        .order_by("id")
        .values_list(*_Row._fields[:-2], "legacy_properties", "attempts")[:limit]
        .iterator(chunk_size=fetch)
    )


def _write_lock_first(using: str) -> None:
    """SQLite: take the database's write lock before reading, so two relays (or a relay and
    a publish-on-commit) never both read, and publish, the same rows. PostgreSQL locks rows."""
    conn = connections[using]
    if conn.vendor == "sqlite":
        with conn.cursor() as cursor:
            cursor.execute(f"UPDATE {OutboxMessage._meta.db_table} SET id = id WHERE 0 = 1")


def _key(row: _Row) -> _Key:
    return row.group, row.routing_key


def _messages(values: Iterator[tuple[Any, ...]]) -> _Chunk:
    """Rows as read and the messages they become (in the read-ahead thread, if any: the
    decoding then overlaps the publishing thread's waits for the broker)."""
    chunk = []
    for value in values:
        row = _Row(*value)
        if row.wire_properties is not None:
            wire = broker.Encoded(bytes(row.wire_properties), row.message_id or None)
            item = broker.Outgoing(row.exchange, row.routing_key, bytes(row.body), None, wire)
        else:
            properties = _properties(row.properties or {})
            item = broker.Outgoing(row.exchange, row.routing_key, bytes(row.body), properties)
        chunk.append((row, item))
    return chunk


def _overtaking(
    chunk: _Chunk, firsts: dict[_Key, int], clear: set[_Key], now: datetime, using: str
) -> tuple[set[_Key], set[_Key]]:
    """(transaction, topic) keys of ``chunk`` with an earlier row still pending that this
    round does not hold (publishing theirs now would overtake it): *waiting*, when that
    row is due (another relay's round has it, or it lies before this round's first row),
    and *deferred*, when it backs off after a refusal. Rows below a key's first row in this
    round are never this round's. Held rows do not count: an operator decides about them.

    A key found clear is not asked about again this round (``clear`` remembers it): its
    first row this round, and so the question, stays the same; a round of one transaction's
    rows asks once, not once per chunk.
    """
    keys = {_key(row) for row, _item in chunk} - clear
    if not keys:
        return set(), set()
    waiting: set[_Key] = set()
    deferred: set[_Key] = set()
    for group, topic, due, later in _earlier_rows(keys, firsts, now, using):
        if due:
            waiting.add((group, topic))
        elif later:
            deferred.add((group, topic))
    clear.update(keys - waiting - deferred)
    return waiting, deferred


def _earlier_rows(
    keys: set[_Key],
    below: dict[_Key, int],
    now: datetime,
    using: str,
    above: dict[_Key, int] | None = None,
) -> list[tuple[str, str, Any, Any]]:
    """Per key: whether a pending row below id ``below[key]`` (and at or above
    ``above[key]``, if given) is due, and whether one backs off.

    Each answer is one step down the (transaction, id) index, not a read of every earlier
    row: a big transaction drained in rounds leaves its deleted rows in the indexes until a
    vacuum, and a query over all rows below the round would read more of them each round
    (see bench/README.md). ``above`` stops the step where an earlier check of the same
    drain found nothing: without it, a key with no earlier row walks every deleted row of
    its transaction each round."""
    conn = connections[using]
    qn = conn.ops.quote_name
    table = qn(OutboxMessage._meta.db_table)
    group, topic, status = qn("group"), qn("routing_key"), qn("status")
    probe = (
        f"SELECT 1 FROM {table} o WHERE o.{group} = k.g AND o.{topic} = k.t"
        f" AND o.{status} = %s AND o.id < k.below AND o.id >= k.above"
        f" AND o.available_at {{}} %s ORDER BY o.{group} DESC, o.id DESC LIMIT 1"
    )
    at = conn.ops.adapt_datetimefield_value(now)
    rows = ", ".join(["(%s, %s, %s, %s)"] * len(keys))
    sql = (
        f"WITH k(g, t, below, above) AS (VALUES {rows})"
        f" SELECT k.g, k.t, ({probe.format('<=')}), ({probe.format('>')}) FROM k"
    )
    params: list[Any] = [v for key in keys for v in (*key, below[key], (above or {}).get(key, 0))]
    params += [OutboxStatus.PENDING, at, OutboxStatus.PENDING, at]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def _gaps(rows: list[_Row], last: dict[_Key, int], using: str) -> dict[_Key, int]:
    """Per (transaction, topic) of ``rows``: the lowest pending row inside the span this
    round is about to publish that the round does not hold, if any.

    Rows are locked as they are read, skipping those another relay's round holds: a round
    reading a big transaction can find a stretch of it locked by another round in the
    middle of its own rows (that round leaves them, waiting for this one's earlier rows),
    and publishing on past it is an inversion. A row backing off after a refusal inside the
    span is one too. The span of a key starts after its last row this round published
    (``last``; its first time, at its first row here: ``_overtaking`` looked below that)
    and ends at its last row in ``rows``. One count per key tells whether every pending
    row there is this round's; only a key where it is not reads the span's ids."""
    spans: dict[_Key, list[int]] = {}
    for row in rows:
        spans.setdefault(_key(row), []).append(row.id)
    if not spans:
        return {}
    after = {key: last.get(key, ids[0] - 1) for key, ids in spans.items()}
    conn = connections[using]
    qn = conn.ops.quote_name
    table = qn(OutboxMessage._meta.db_table)
    group, topic, status = qn("group"), qn("routing_key"), qn("status")
    values = ", ".join(["(%s, %s, %s, %s)"] * len(spans))
    sql = (
        f"WITH k(g, t, after, upto) AS (VALUES {values})"
        f" SELECT k.g, k.t, (SELECT COUNT(*) FROM {table} o WHERE o.{group} = k.g"
        f" AND o.{topic} = k.t AND o.{status} = %s AND o.id > k.after AND o.id <= k.upto)"
        " FROM k"
    )
    params: list[Any] = [v for key, ids in spans.items() for v in (*key, after[key], ids[-1])]
    with conn.cursor() as cursor:
        cursor.execute(sql, [*params, OutboxStatus.PENDING])
        short = [(g, t) for g, t, count in cursor.fetchall() if count > len(spans[(g, t)])]
    gaps = {}
    for key in short:
        ids = spans[key]
        pending = (
            OutboxMessage.objects.using(using)
            .filter(
                group=key[0],
                routing_key=key[1],
                status=OutboxStatus.PENDING,
                id__gt=after[key],
                id__lte=ids[-1],
            )
            .values_list("id", flat=True)
        )
        foreign = set(pending) - set(ids)
        if foreign:
            gaps[key] = min(foreign)
    return gaps


def _read_ahead(chunks: Iterator[_Chunk], depth: int = READ_AHEAD) -> Generator[_Chunk, None, None]:
    """``chunks`` read by a thread of its own, up to ``depth`` ahead of the one in use.

    On PostgreSQL each chunk is a ``FETCH`` from the round's server-side cursor: a round trip
    the publishing thread would otherwise wait for between chunks while the broker runs dry.
    The reader only fetches from the cursor the round opened (the connection's own lock
    orders it with the round's other statements); it is done, or stopped and joined, before
    the round deletes and commits.
    """
    ready: queue.Queue[_Chunk | BaseException | None] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def read() -> None:
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                ready.put(chunk)
        except BaseException as exc:  # handed to the publishing thread, raised there
            ready.put(exc)
        else:
            ready.put(None)

    reader = threading.Thread(target=read, name="rmq-outbox-read-ahead", daemon=True)
    reader.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while reader.is_alive():  # let a reader blocked on a full queue see the stop
            with contextlib.suppress(queue.Empty):
                ready.get(timeout=0.05)
        reader.join()


def _properties(stored: dict[str, Any]) -> dict[str, Any]:
    props = headers_from_json(stored)
    props.setdefault("headers", {})
    return props


def _settle(
    claimed: dict[int, _Claim], outcome: PublishOutcome, now: datetime, using: str
) -> tuple[int, int, int]:
    """What the broker said about a round's messages, written down: the confirmed rows
    deleted, each refusal recorded. ``claimed`` maps ``id(message)`` to its row; messages
    without an answer are left as they are. Returns (published, refused, newly held)."""
    done = [claimed[id(item)].id for item in outcome.confirmed]
    refused = [(claimed[id(item)], item) for item in outcome.failed]
    culprits = [(claimed[id(item)], item) for item in outcome.refused]
    if done:
        OutboxMessage.objects.using(using).filter(ids_in(done, using)).delete()
    held = _count_refusals(refused, now, using) + _hold_culprits(culprits, using)
    return len(done), len(refused) + len(culprits), held


def _hold_culprits(culprits: list[tuple[_Claim, broker.Outgoing]], using: str) -> int:
    """Hold each row the broker refuses for what it carries (a ``user_id`` that is not the
    relay's login, properties too large for a frame, ...): publishing it again cannot
    help, so it waits for an operator at once (the outbox admin shows why) while the rows
    after it flow. Not counted as an outage: nothing else is held up by it."""
    for row, item in culprits:
        logger.error(
            "outbox row %s (message %r) is held: the broker refuses it: %s",
            row.id,
            item.message_id,
            item.refused,
        )
        OutboxMessage.objects.using(using).filter(pk=row.id).update(
            attempts=row.attempts + 1,
            last_error=f"refused by the broker: {item.refused}",
            status=OutboxStatus.HELD,
        )
    return len(culprits)


def _count_refusals(
    refused: list[tuple[_Claim, broker.Outgoing]], now: datetime, using: str
) -> int:
    """Record a refusal on each row: back off, or hold it for an operator after the last try."""
    max_attempts = int(app_settings.OUTBOX_MAX_ATTEMPTS)
    held = 0
    for row, item in refused:
        attempts = row.attempts + 1
        hold = attempts >= max_attempts
        held += hold
        delay = min(REFUSED_FIRST_DELAY * 2 ** (attempts - 1), REFUSED_MAX_DELAY)
        OutboxMessage.objects.using(using).filter(pk=row.id).update(
            attempts=attempts,
            last_error=_refusal_text(item),
            status=OutboxStatus.HELD if hold else OutboxStatus.PENDING,
            available_at=now + timedelta(seconds=delay),
        )
    return held


def _refusal_text(item: broker.Outgoing) -> str:
    if item.returned:
        return (
            f"unroutable: no queue is bound for routing key {item.routing_key!r} on exchange "
            f"{item.exchange!r} (is a consumer of this topic deployed?)"
        )
    return f"the broker refused (nacked) the message to {item.exchange!r}"


def release_held(rows: QuerySet[OutboxMessage]) -> int:
    """Give held rows (and rows backing off) another round of attempts, due now. For the
    admin's action and ``rmq_relay --release-held``; returns the rows released."""
    count = rows.update(
        status=OutboxStatus.PENDING, attempts=0, available_at=timezone.now(), last_error=""
    )
    if count:
        relay_wakeup.set()
    return count
