"""Relay rounds that overlap (PostgreSQL): one publish stream, fed round after round, while
each round's database work runs beside it.

Rounds one after the other leave the broker idle at each round's end (the last confirms, the
DELETE, the COMMIT, the next round's first FETCH) and the database idle while the broker
works. Here two threads, each with a database connection (and so a transaction) of its own,
take turns: round k+1 locks the rows after round k's last as soon as round k has read its
own, and hands its messages to the one stream right behind round k's; round k waits for the
broker's answers to its messages, then deletes the confirmed rows and commits while round k+1
is being published. Messages leave in the order of their rows, as they would one round after
the other.

Order: round k+1's rows of a (transaction, topic) may have earlier rows in a round still in
flight here (locked by it, ahead on the wire): those do not hold them back. Any other earlier
pending row does, as in a round alone (``relay._overtaking``). As within a round, a refusal
(unroutable, nacked) is known only once later messages may be on the wire: the rounds
already handed over go on, no further round starts, and the caller goes on with rounds one
at a time, which keep the refused row's later rows of its transaction and topic behind it.
So do rows held back, the broker unreachable, a database error and ``stop``.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from .. import broker
from ..conf import app_settings
from ..core.errors import PublishError
from ..models import OutboxMessage, OutboxStatus
from ..publishing import Publisher, get_publisher
from . import relay
from .relay import RelayRound, _Chunk, _Key

#: Threads (and database connections) taking turns at rounds: a round waits for its
#: answers, deletes and commits while the others read and hand over theirs.
ROUND_THREADS = 2

#: Body bytes one round reads at most (as many rounds as threads are in memory at once).
ROUND_BYTES = 16 * 1024 * 1024
#: Rows one FETCH of a round returns.
ROUND_FETCH = 2000
#: Seconds a round waiting for answers looks whether the stream has ended meanwhile.
STREAM_DONE_LOOK = 0.05


class _Answers:
    """A round's messages and whether the broker has answered them all.

    :meth:`check` runs on the publishing thread, between messages (answers are set there, by
    the pipeline's I/O loop); the round's own thread sleeps in :meth:`wait`.
    """

    def __init__(self, messages: list[broker.Outgoing]) -> None:
        self.messages = messages
        self._next = 0  # messages before this one are answered
        self._all_in = threading.Event()

    def check(self) -> bool:
        messages, i = self.messages, self._next
        while i < len(messages) and messages[i].state:
            i += 1
        self._next = i
        if i == len(messages):
            self._all_in.set()
            return True
        return False

    def wait(self, stream_done: threading.Event) -> None:
        """Until all are answered, or the stream ended (unanswered ones stay unanswered)."""
        while not self._all_in.wait(STREAM_DONE_LOOK):
            if stream_done.is_set():
                self.check()  # the pipeline's last answers came after the stream's end
                return


@dataclass
class _Turn:
    """One round, as the next round sees it."""

    read: threading.Event = field(default_factory=threading.Event)  # handed over, or not
    handed: bool = False  # its messages went to the stream (False: the stream ends there)
    ids: set[int] = field(default_factory=set)  # the rows it publishes
    last_id: int | None = None
    full: bool = False
    result: RelayRound = field(default_factory=RelayRound)


class _Overlap:
    def __init__(self, using: str, after: int | None, stop: threading.Event | None) -> None:
        self.using = using
        self.after = after
        self.stop = stop
        self.limit = int(app_settings.OUTBOX_BATCH_SIZE)
        self.turns: dict[int, _Turn] = {}
        self.lock = threading.Lock()
        self.in_flight: dict[_Key, set[int]] = {}  # rows of rounds not yet committed
        self.clear_below: dict[_Key, int] = {}  # per key: no row left behind below this id
        self.rounds: queue.Queue[_Answers | None] = queue.Queue()
        self.ended = threading.Event()  # no further round starts
        self.stream_done = threading.Event()  # nothing more will be answered
        self.clean = True  # every round published and confirmed all its rows
        self.error: BaseException | None = None

    # The publishing side (the caller's thread) ---------------------------------------------
    def stream(self) -> Iterator[broker.Outgoing | None]:
        """Each round's messages as it hands them over, ``None`` while none is ready (the
        pipeline then takes answers in). Between two messages it tells the rounds waiting
        for answers that theirs are all in (:class:`_Answers`: no polling thread)."""
        waiting: collections.deque[_Answers] = collections.deque()
        while True:
            while waiting and waiting[0].check():
                waiting.popleft()
            try:
                handed = self.rounds.get_nowait()
            except queue.Empty:
                yield None
                continue
            if handed is None:
                return
            waiting.append(handed)
            for item in handed.messages:
                yield item
                if waiting[0].check():
                    waiting.popleft()

    # The database side (two threads) ----------------------------------------------------------
    def turn(self, k: int) -> _Turn:
        with self.lock:
            return self.turns.setdefault(k, _Turn())

    def worker(self, first: int) -> None:
        """Rounds ``first``, ``first + 2``, … on this thread and its database connection."""
        try:
            for k in itertools.count(first, ROUND_THREADS):
                if not self.round(k):
                    return
        finally:
            connections[self.using].close()

    def round(self, k: int) -> bool:
        """Round ``k``; whether another may follow it."""
        me, prev = self.turn(k), (self.turn(k - 1) if k else None)
        if prev is not None:
            prev.read.wait()
        try:
            if prev is not None and not (prev.handed and prev.full):
                return False
            if self.ended.is_set() or (self.stop is not None and self.stop.is_set()):
                return False
            with transaction.atomic(using=self.using):
                self._run(me, prev)
            return me.full
        except BaseException as exc:  # raised by drain() once every thread is done
            with self.lock:
                self.error = self.error or exc
            self.ended.set()
            return False
        finally:
            if not me.handed and (prev is None or prev.handed):
                self.rounds.put(None)  # the stream ends after the last round handed over
            me.read.set()
            with self.lock:  # committed or rolled back: no longer in flight
                for ids in self.in_flight.values():
                    ids.difference_update(me.ids)

    def _run(self, me: _Turn, prev: _Turn | None) -> None:
        now = timezone.now()
        after = prev.last_id if prev is not None else self.after
        chunk, size = self._read(now, after)
        if not chunk:
            return
        me.last_id = chunk[-1][0].id
        me.full = len(chunk) >= self.limit or size >= ROUND_BYTES
        firsts: dict[_Key, int] = {}
        for row, _item in chunk:
            firsts.setdefault(relay._key(row), row.id)
        with self.lock:
            ahead = {key: set(self.in_flight.get(key, ())) for key in firsts}
            clear_below = {key: self.clear_below.get(key, 0) for key in firsts}
        blocked = _held_back(firsts, ahead, clear_below, now, self.using)
        with self.lock:  # a transaction's rows are all written at its commit: none appears
            for key in firsts.keys() - blocked:  # below a key found clear later on
                self.clear_below[key] = max(firsts[key], self.clear_below.get(key, 0))
        items = [(row, item) for row, item in chunk if relay._key(row) not in blocked]
        me.ids = {row.id for row, _item in items}
        with self.lock:
            for row, _item in items:
                self.in_flight.setdefault(relay._key(row), set()).add(row.id)
        if blocked:  # rows wait: rounds one at a time look again from the oldest row
            self.ended.set()
            self.clean = False
        messages = [item for _row, item in items]
        answers = _Answers(messages)
        self.rounds.put(answers)
        me.handed = True
        me.read.set()  # the next round may lock the rows after these now
        answers.wait(self.stream_done)
        if not all(item.confirmed for item in messages):
            self.ended.set()
            self.clean = False
        claimed = {id(item): relay._Claim(row.id, row.attempts) for row, item in items}
        published, refused, held = relay._settle(claimed, messages, now, self.using)
        left = len(chunk) - len(items)
        me.result = RelayRound(published, refused, held, len(chunk), me.last_id, left)

    def _read(self, now: datetime, after: int | None) -> tuple[_Chunk, int]:
        """Lock and read this round's rows (up to the row limit or ``ROUND_BYTES``)."""
        # Few round trips: this thread waits for the interpreter lock after each one while
        # the publishing thread runs (a FETCH of 100 rows cost a round about 20 such waits).
        fetch = min(self.limit, ROUND_FETCH)
        rows = relay._lock_due_rows(self.using, now, after=after, limit=self.limit, fetch=fetch)
        chunk: _Chunk = []
        size = 0
        try:
            for part in iter(lambda: relay._messages(itertools.islice(rows, fetch)), []):
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
    firsts: dict[_Key, int],
    ahead: dict[_Key, set[int]],
    clear_below: dict[_Key, int],
    now: datetime,
    using: str,
) -> set[_Key]:
    """Keys with an earlier pending row that is not in a round in flight here: below the
    earliest such row (``relay._earlier_rows``'s one-step probe, down to where this drain
    last found nothing), or between it and this round's first row of the key (rows of the
    rounds in flight are ahead on the wire; any other row there was left by them, or is
    another relay's)."""
    keys = set(firsts)
    below = {key: min(ahead[key], default=firsts[key]) for key in keys}
    probed = {key for key in keys if clear_below.get(key, 0) < below[key]}
    blocked = (
        {
            (group, topic)
            for group, topic, due, later in relay._earlier_rows(
                probed, below, now, using, above=clear_below
            )
            if due or later
        }
        if probed
        else set()
    )
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
    """Overlapping rounds from after row ``after`` while they come back full.

    Returns the totals (``waiting``: rows held back, summed) and whether every round
    published and confirmed all its rows (if not, rows are left for rounds one at a time).
    ``PublishError`` and database errors are raised once every thread is done; rows the
    broker confirmed before are deleted all the same.
    """
    overlap = _Overlap(using, after, stop)
    workers = [
        threading.Thread(target=overlap.worker, args=(w,), name=f"rmq-outbox-round-{w}")
        for w in range(ROUND_THREADS)
    ]
    for worker in workers:
        worker.start()
    unreachable: PublishError | None = None
    try:
        (publisher or get_publisher())._stream(overlap.stream())
    except PublishError as exc:
        unreachable = exc
    finally:
        overlap.ended.set()
        overlap.stream_done.set()
        for worker in workers:
            worker.join()
    if overlap.error is not None:
        raise overlap.error
    if unreachable is not None:
        raise unreachable
    rounds = [t.result for _k, t in sorted(overlap.turns.items()) if t.result.claimed]
    total = RelayRound(
        published=sum(r.published for r in rounds),
        refused=sum(r.refused for r in rounds),
        held=sum(r.held for r in rounds),
        claimed=sum(r.claimed for r in rounds),
        last_id=rounds[-1].last_id if rounds else after,
        waiting=sum(r.waiting for r in rounds),
    )
    return total, overlap.clean
