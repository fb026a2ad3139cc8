"""Two relay rounds at once (PostgreSQL): the next round locks and reads its rows while this
one publishes; this one deletes and commits while the next one publishes.

Rounds one after the other leave the broker idle at each round's end (the DELETE, the COMMIT,
the next round's first FETCH) and the database idle while the broker works. Here rounds run
on two threads, each with a database connection (and so a transaction) of its own: round
k+1 locks the rows after round k's last while round k publishes, and publishes only once
round k's publish returned with every message confirmed, so messages leave in the order of
their rows, as they would one round after the other.

Order: round k+1's rows of a (transaction, topic) may have earlier rows in a round still in
flight here (locked by it, ahead on the wire): those do not hold them back. Any other earlier
pending row does, as in a round alone (``relay._overtaking``).

Anything but a clean round (a refusal, rows held back, the broker unreachable, a database
error, ``stop``) ends the overlap: rounds still in flight publish nothing and roll back, and
the caller goes on with rounds one at a time, which handle all of those.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..batches import ids_in
from ..conf import app_settings
from ..core.errors import PublishError
from ..models import OutboxMessage, OutboxStatus
from ..publishing import Publisher, get_publisher
from . import relay
from .relay import RelayRound, _Chunk, _Key

#: Body bytes one round reads at most (two or three rounds are in memory at once).
ROUND_BYTES = 16 * 1024 * 1024


class _Abandoned(Exception):
    """Raised inside a round's transaction: roll it back, nothing published."""


@dataclass
class _Turn:
    """One round, as the next round sees it."""

    read: threading.Event = field(default_factory=threading.Event)  # its rows are locked
    published: threading.Event = field(default_factory=threading.Event)  # its publish returned
    last_id: int | None = None
    full: bool = False
    clean: bool = False  # published, every message confirmed, nothing held back
    ids: set[int] = field(default_factory=set)  # rows it publishes
    result: RelayRound = field(default_factory=RelayRound)


class _Overlap:
    def __init__(
        self, using: str, publisher: Publisher, after: int | None, stop: threading.Event | None
    ) -> None:
        self.using = using
        self.publisher = publisher
        self.after = after
        self.stop = stop
        self.limit = int(app_settings.OUTBOX_BATCH_SIZE)
        self.turns: dict[int, _Turn] = {}
        self.lock = threading.Lock()
        self.in_flight: dict[_Key, set[int]] = {}  # rows of rounds not yet committed
        self.ended = threading.Event()  # no further round may publish
        self.error: BaseException | None = None

    def turn(self, k: int) -> _Turn:
        with self.lock:
            return self.turns.setdefault(k, _Turn())

    def worker(self, first: int) -> None:
        """Rounds ``first``, ``first + 2``, … on this thread and its database connection."""
        try:
            for k in itertools.count(first, 2):
                if not self.round(k):
                    return
        except BaseException as exc:  # raised by drain() once both threads are done
            with self.lock:
                self.error = self.error or exc
            self.ended.set()
        finally:
            connections[self.using].close()

    def round(self, k: int) -> bool:
        """Round ``k``; whether another may follow it."""
        me, prev = self.turn(k), (self.turn(k - 1) if k else None)
        try:
            if prev is not None:
                prev.read.wait()
                if not prev.full:
                    return False
            if self.ended.is_set() or (self.stop is not None and self.stop.is_set()):
                self.ended.set()
                return False
            try:
                with transaction.atomic(using=self.using):
                    self._run(me, prev)
            except _Abandoned:
                return False
            finally:  # committed or rolled back: no longer in flight
                with self.lock:
                    for ids in self.in_flight.values():
                        ids.difference_update(me.ids)
            return me.full and me.clean
        finally:
            me.read.set()  # whatever happened, the next round never waits for ever
            me.published.set()

    def _run(self, me: _Turn, prev: _Turn | None) -> None:
        now = timezone.now()
        after = prev.last_id if prev is not None else self.after
        chunk, size = self._read(now, after)
        if not chunk:
            raise _Abandoned
        me.last_id = chunk[-1][0].id
        me.full = len(chunk) >= self.limit or size >= ROUND_BYTES
        firsts: dict[_Key, int] = {}
        for row, _item in chunk:
            firsts.setdefault(relay._key(row), row.id)
        with self.lock:
            ahead = {key: set(self.in_flight.get(key, ())) for key in firsts}
        blocked = _held_back(firsts, ahead, now, self.using)
        items = [(row, item) for row, item in chunk if relay._key(row) not in blocked]
        me.ids = {row.id for row, _item in items}
        with self.lock:
            for row, _item in items:
                self.in_flight.setdefault(relay._key(row), set()).add(row.id)
        me.read.set()  # the next round may lock the rows after these now
        if prev is not None:
            prev.published.wait()
            if not prev.clean:
                self.ended.set()
        if self.ended.is_set():
            raise _Abandoned
        claimed = {id(item): relay._Claim(row.id, row.attempts) for row, item in items}
        unreachable: PublishError | None = None
        try:
            sent = self.publisher.publish_stream(iter([item for _row, item in items]))
        except PublishError as exc:
            unreachable, sent = exc, getattr(exc, "sent", [])
        done = [claimed[id(item)].id for item in sent if item.confirmed]
        refused = [(claimed[id(item)], item) for item in sent if item.nacked or item.returned]
        me.clean = unreachable is None and not blocked and len(done) == len(items)
        if not me.clean:
            self.ended.set()
        me.published.set()  # the next round may publish now, if this one was clean
        if done:
            OutboxMessage.objects.using(self.using).filter(ids_in(done, self.using)).delete()
        held = relay._count_refusals(refused, now, self.using)
        left = sum(1 for row, _item in chunk if relay._key(row) in blocked)
        me.result = RelayRound(len(done), len(refused), held, len(chunk), me.last_id, left)
        if unreachable is not None:
            raise unreachable

    def _read(self, now: datetime, after: int | None) -> tuple[_Chunk, int]:
        """Lock and read this round's rows (up to the row limit or ``ROUND_BYTES``)."""
        rows = relay._lock_due_rows(self.using, now, after=after, limit=self.limit)
        chunk: _Chunk = []
        size = 0
        try:
            for part in iter(lambda: relay._messages(itertools.islice(rows, relay.FETCH)), []):
                chunk += part
                size += sum(len(item.body) for _row, item in part)
                if size >= ROUND_BYTES:
                    break
        finally:
            close = getattr(rows, "close", None)
            if close is not None:  # rows not fetched are not locked: the next round's
                close()
        return chunk, size


def _held_back(
    firsts: dict[_Key, int], ahead: dict[_Key, set[int]], now: datetime, using: str
) -> set[_Key]:
    """Keys with an earlier pending row that is not in a round in flight here: below the
    earliest such row (``relay._overtaking``'s one-step probe), or between it and this
    round's first row of the key (rows of the rounds in flight are ahead on the wire; any
    other row there was left by them, or is another relay's)."""
    keys = set(firsts)
    below = {key: min(ahead[key], default=firsts[key]) for key in keys}
    blocked = {
        (group, topic)
        for group, topic, due, later in relay._earlier_rows(keys, below, now, using)
        if due or later
    }
    spans = [key for key in keys if key not in blocked and below[key] < firsts[key]]
    if spans:
        between = Q()
        for group, topic in spans:
            between |= Q(
                group=group,
                routing_key=topic,
                id__gte=below[(group, topic)],
                id__lt=firsts[(group, topic)],
            )
        rows = (
            OutboxMessage.objects.using(using)
            .filter(between, status=OutboxStatus.PENDING)
            .values_list("group", "routing_key", "id")
        )
        for group, topic, row_id in rows:
            if row_id not in ahead[(group, topic)]:
                blocked.add((group, topic))
    return blocked


def drain(
    *,
    using: str = "default",
    publisher: Publisher | None = None,
    after: int | None = None,
    stop: threading.Event | None = None,
) -> tuple[RelayRound, bool]:
    """Overlapped rounds from after row ``after`` while they come back full and clean.

    Returns the totals (``waiting``: rows held back, summed) and whether every round was
    clean; if not, rows are left for rounds one at a time. ``PublishError`` and database
    errors are raised once both threads are done (rows confirmed before are deleted).
    """
    overlap = _Overlap(using, publisher or get_publisher(), after, stop)
    threads = [
        threading.Thread(target=overlap.worker, args=(w,), name=f"rmq-outbox-round-{w}")
        for w in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if overlap.error is not None:
        raise overlap.error
    rounds = [t for _k, t in sorted(overlap.turns.items()) if t.result.claimed]
    total = RelayRound(
        published=sum(t.result.published for t in rounds),
        refused=sum(t.result.refused for t in rounds),
        held=sum(t.result.held for t in rounds),
        claimed=sum(t.result.claimed for t in rounds),
        last_id=rounds[-1].result.last_id if rounds else after,
        waiting=sum(t.result.waiting for t in rounds),
    )
    return total, all(t.clean for t in rounds)
