"""Claims: which requeue run may publish a parked row, and the loading of claimed rows.

A run claims a row by inserting its ``ParkedClaim`` (the first insert wins: the primary
key refuses a second), publishes it, and marks it requeued only while the claim holds
(``parking.requeuing``). The claims of one run are made, and their rows loaded in chunks of
bounded bytes, on a thread of their own one chunk ahead of the publisher.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import DatabaseError, connections
from django.db.models import Exists, OuterRef, QuerySet, Subquery
from django.db.models.lookups import Exact
from django.utils import timezone

from ..conf import app_settings
from ..db import locks
from ..db.batches import ids_in
from ..db.threads import start_daemon
from ..models import ParkedClaim, ParkedMessage, ParkedStatus

logger = logging.getLogger("django_rmq_retry.parking")


def claim(ids: list[int], token: str, using: str, lock_wait: float | None = None) -> list[int]:
    """Claim the rows ``ids`` for the run ``token``; the ids it got (a row another run holds
    is not taken: the claims' primary key refuses a second claim).

    With ``lock_wait`` (PostgreSQL), a row another transaction holds locked is not claimed
    either (``SKIP LOCKED``): its mark would wait for that lock after the copy was sent.
    It stays parked for the next run. The claim waits at most ``lock_wait`` seconds for
    another run's claim of the same row to commit; past that it claims nothing now.
    """
    connection = connections[using]
    at = timezone.now()
    now = connection.ops.adapt_datetimefield_value(at)
    table = connection.ops.quote_name(ParkedClaim._meta.db_table)
    insert = f"INSERT INTO {table} (parked_id, token, claimed_at) "
    returning = " ON CONFLICT (parked_id) DO NOTHING RETURNING parked_id"
    if connection.vendor == "postgresql" and lock_wait is not None:
        parked = connection.ops.quote_name(ParkedMessage._meta.db_table)
        pk = connection.ops.quote_name(ParkedMessage._meta.pk.column)
        sql = (
            insert + f"SELECT {pk}, %s, %s FROM {parked} WHERE {pk} = ANY(%s::bigint[]) "
            "FOR NO KEY UPDATE SKIP LOCKED" + returning
        )
        params: list[Any] = [token, now, ids]
    elif connection.vendor == "postgresql":
        sql, params = insert + "SELECT unnest(%s::bigint[]), %s, %s" + returning, [ids, token, now]
    elif connection.vendor == "sqlite" and connection.features.can_return_rows_from_bulk_insert:
        sql = insert + "SELECT value, %s, %s FROM json_each(%s) WHERE true" + returning
        params = [token, now, json.dumps(ids)]
    else:  # one statement to insert, one to read back what was ours
        claims = ParkedClaim.objects.using(using)
        claims.bulk_create(
            [ParkedClaim(parked_id=pk, token=token, claimed_at=at) for pk in ids],
            ignore_conflicts=True,
        )
        return list(claims.filter(ids_in(ids, using), token=token).values_list("pk", flat=True))
    try:
        with locks.bounded(using, lock_wait), connection.cursor() as cursor:
            cursor.execute(sql, params)
            return sorted(row[0] for row in cursor.fetchall())
    except DatabaseError as exc:
        if not locks.timed_out(exc):
            raise
        logger.warning(
            "requeue: %d row(s) not claimed now: another run's claim held them", len(ids)
        )
        return []


def stale_before() -> datetime:
    """Claims made before this belong to a run that was killed: they no longer hold."""
    return timezone.now() - timedelta(seconds=int(app_settings.REQUEUE_CLAIM_TIMEOUT))


def being_requeued(using: str) -> Exists:
    """Whether a parked row is claimed by a requeue run still in time (for ``exclude``):
    discard and purge leave such rows to the run."""
    return Exists(
        ParkedClaim.objects.using(using).filter(
            parked_id=OuterRef("pk"), claimed_at__gte=stale_before()
        )
    )


def held_by(token: str, using: str) -> Exact:
    """Whether a parked row is still claimed by the run ``token`` (for ``filter``).

    The claim's token compared per row, not ``EXISTS``: PostgreSQL turns an ``EXISTS`` into
    a join planned from the claims table's statistics, and without them (autovacuum off, or
    claims inserted a moment ago) it may choose a nested loop over every claim of the run
    for each row: a mark then grows with the number of claims. A scalar subquery stays one
    primary-key probe per row, whatever the statistics say.
    """
    claim = ParkedClaim.objects.using(using).filter(parked_id=OuterRef("pk"))
    return Exact(Subquery(claim.values("token")[:1]), token)


#: A requeue batch is loaded and published in chunks of at most this many body bytes (or
#: ``CHUNK_ROWS`` rows): with one chunk loading ahead and two in flight, memory is a few
#: chunks for any body size. A larger chunk only raises the peak memory: two in flight
#: already keep the broker busy (see bench/README.md).
CHUNK_BYTES = 2 * 1024 * 1024
CHUNK_ROWS = 1000
#: Seconds the publisher waits for the next chunk before taking in confirms meanwhile.
POLL_WAIT = 0.001


class Stored(NamedTuple):
    """The columns a requeue reads to publish a row again (and to say why it failed): no
    model instance (its construction is CPU spent on every row for nothing the requeue
    uses; see bench/README.md), not the traceback, the history or the error."""

    pk: int
    body: bytes
    properties: dict[str, Any]
    headers: dict[str, Any]
    queue: str
    exchange: str
    routing_key: str
    requeue_count: int


@dataclass
class Chunk:
    rows: list[Stored]  # claimed by this run, to publish
    matched: int = 0  # candidates looked at for this chunk's claim
    skipped: int = 0  # of those, claimed by someone else meanwhile


@dataclass
class Claims:
    """Claims candidates batch by batch and loads the claimed rows in bounded chunks."""

    candidates: QuerySet[ParkedMessage]
    token: str
    using: str
    batch_size: int
    limit: int | None
    #: Seconds a claim may wait for a lock now (``None``: no bound; see ``claim``).
    lock_wait: Callable[[], float | None] = lambda: None

    def chunks(self) -> Iterator[Chunk]:
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
            claimed = claim(ids, self.token, self.using, self.lock_wait())
            claimed_total += len(claimed)
            first = Chunk([], matched=len(ids), skipped=len(ids) - len(claimed))
            if not claimed:
                yield first
                continue
            yield from self._load(claimed, first)

    def _load(self, ids: list[int], first: Chunk) -> Iterator[Chunk]:
        """The rows this run claimed (``ids``) still parked, in chunks of bounded bytes.

        Ids and body sizes first, then each chunk's rows by primary key, read to the end
        before it is handed on: memory holds a chunk's bodies, never a fetch's worth (a
        fetch of 200 rows of 256 KiB is 50 MiB), and no read cursor stays open while the
        chunk is published (on SQLite an open cursor blocks the requeue's own marks).
        """
        manager = ParkedMessage.objects.using(self.using)
        # Still parked: between the candidates' read and the claim another run may have
        # requeued a row and let go of its claim (the claim no longer told us it was taken).
        sizes = list(
            manager.filter(ids_in(ids, self.using), status=ParkedStatus.PARKED)
            .order_by("pk")
            .values_list("pk", "body_size")
        )
        head: Chunk | None = first  # carries the claim's counts
        group: list[int] = []
        group_bytes = 0
        for index, (pk, size) in enumerate(sizes):
            group.append(pk)
            group_bytes += size or 0
            if index < len(sizes) - 1 and group_bytes < CHUNK_BYTES and len(group) < CHUNK_ROWS:
                continue
            chunk, head = head or Chunk([]), None
            loaded = manager.filter(ids_in(group, self.using)).order_by("pk")
            chunk.rows = [Stored(*values) for values in loaded.values_list(*Stored._fields)]
            yield chunk
            group, group_bytes = [], 0
        if head is not None:
            yield head  # every claim was lost to a concurrent run meanwhile


class ClaimAhead:
    """Runs ``Claims.chunks()`` on a daemon thread, one chunk ahead of the publisher."""

    def __init__(self, claims: Claims) -> None:
        self._claims = claims
        self._queue: queue.Queue[Chunk | BaseException | None] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = start_daemon(self._run, "rmq-requeue-claims")

    def poll(self) -> Iterator[Chunk | None]:
        """The chunks, and ``None`` whenever the next is not loaded after ``POLL_WAIT``
        seconds (the publisher takes in confirms meanwhile instead of waiting here). The
        short wait keeps a publisher that answers at once (the in-memory broker's, a test's)
        from spinning on the interpreter lock the loading thread needs."""
        while True:
            try:
                item = self._queue.get(timeout=POLL_WAIT)
            except queue.Empty:
                yield None
                continue
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

    def _put(self, item: Chunk | BaseException | None) -> bool:
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
