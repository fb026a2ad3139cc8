"""The consumer's parking thread: commits parked rows in batches, then lets them be acked.

Why a thread of its own: a commit waits for the database's disk. When a receiver fails for
every message (a bad deploy, a downstream outage past its last attempt), a worker that
parks one row per commit spends most of its time waiting on fsync. Here workers only
*describe* the row; this thread takes whatever accumulated while its last commit ran and
writes it with one INSERT and one commit (:func:`parking.park_many`), so the batch grows
with the load and the commit cost is shared. Nothing is acked before its row is committed:
the consumer acks a delivery only when ``on_batch_done`` reports ``(token, True)`` for it.
Each commit is reported once, as one batch, so the consumer's thread wakes once for it and
its rows, delivered together, are acked with one ``multiple=True`` ack.

While the database is down, or cannot write now (a lock, a deadlock: ``core.busy``), the
thread holds every row unacked, says so once, and retries with backoff; workers keep
running receivers meanwhile. A delivery whose broker connection was replaced (it will be
redelivered) is dropped from the batch, not written.

A row the database refuses even stripped (a trigger, a constraint of the operator's) is
*held*: not acked, not given back (that would only run its receiver again and fail the same
way, in a hot loop), said once at ERROR, and tried again with a capped backoff until the
database takes it or the consumer stops (then it goes back to its queue, and its
delivery-limit row counts the give-back). Nothing is lost; one prefetch slot is taken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from queue import Empty, SimpleQueue
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections

from .. import hooks as _hooks
from ..conf import app_settings
from ..core.backoff import CappedBackoff
from ..core.busy import database_busy
from ..core.floods import FloodSummary
from ..core.logfields import fields
from ..core.names import Names
from ..db.tables import missing_tables_message
from ..db.threads import start_daemon
from ..parking import ParkRequest, park, park_many, stripped_request

logger = logging.getLogger("django_rmq_retry.consumer")

#: Rows written per commit at most (bounds one statement's size and one rollback's cost).
MAX_BATCH = 200
#: Seconds without a row to park after which the thread's connection is checked as at the
#: end of a request (closed past CONN_MAX_AGE).
IDLE_AFTER = 1.0
#: Longest wait between two tries of rows the database refused even stripped.
HOLD_MAX_DELAY = 10.0


@dataclass(frozen=True)
class ParkJob:
    """One delivery to park: ``token`` identifies it to the consumer's callback."""

    token: Any
    request: ParkRequest
    start_key: str | None  # the delivery-limit row to delete once parked
    log_line: str  # logged (WARNING) once the row is committed


class ParkWriter:
    """A daemon thread writing :class:`ParkJob` batches; see the module docstring."""

    def __init__(
        self,
        names: Names,
        *,
        on_batch_done: Callable[[list[tuple[Any, bool]]], None],
        on_stored: Callable[[list[str | None]], None],
        is_current: Callable[[Any], bool],
        stop: threading.Event,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._names = names
        #: ``[(token, stored)]`` once per batch: committed (ack) or given up (give back).
        self._on_batch_done = on_batch_done
        self._on_stored = on_stored
        self._is_current = is_current
        self._stop = stop
        self._max_batch = max_batch
        self._queue: SimpleQueue[ParkJob | None] = SimpleQueue()
        self._held: list[ParkJob] = []  # refused even stripped: unacked, tried again later
        self._held_backoff = CappedBackoff(1.0, HOLD_MAX_DELAY)
        self._held_due = 0.0
        self._hooks = _hooks.current  # observability (None: off)
        #: A flood of parks is told in a few lines (the first of each receiver, then counts).
        self._flood = FloodSummary(float(app_settings.PARK_LOG_INTERVAL))
        start_daemon(self._loop, "rmq-park-writer")

    def submit(self, job: ParkJob) -> None:
        self._queue.put(job)

    def close(self) -> None:
        """Let the thread finish the batch it holds and exit (it is a daemon: never joined)."""
        self._queue.put(None)

    # Thread -----------------------------------------------------------------------------
    def _next(self) -> ParkJob | bool | None:
        """The next job, ``None`` to close, or ``False`` when held rows are due first."""
        if not self._held:
            try:
                return self._queue.get(timeout=IDLE_AFTER)
            except Empty:
                # Idle: end of "request" for Django (CONN_MAX_AGE, health checks). Not after
                # every batch: a flood's batches follow each other within milliseconds, and
                # each would pay a health-check query, or with CONN_MAX_AGE=0 (Django's
                # default) a new connection. A connection lost meanwhile is an error
                # _write retries.
                close_old_connections()
                tell_floods(self._flood, everything=True)  # idle: the flood is over
                return self._queue.get()
        wait = self._held_due - time.monotonic()
        if wait <= 0 or self._stop.is_set():
            return False
        try:
            return self._queue.get(timeout=min(wait, 0.5))
        except Empty:
            return False

    def _loop(self) -> None:
        closing = False
        while not closing:
            job = self._next()
            if job is False:
                self._retry_held()
                continue
            if job is None:
                self._release_held()
                return
            assert isinstance(job, ParkJob)
            batch = [job]
            while len(batch) < self._max_batch:
                try:
                    more = self._queue.get_nowait()
                except Empty:
                    break
                if more is None:
                    closing = True
                    break
                batch.append(more)
            try:
                self._write(batch)
            except BaseException:  # a bug of ours: give the deliveries back, keep the thread
                logger.exception("internal error parking %d message(s); releasing them", len(batch))
                self._on_batch_done([(job.token, False) for job in batch])
        self._release_held()

    def _release_held(self) -> None:
        """Closing: held rows go back to their queues (the delivery limit counts it)."""
        tell_floods(self._flood, everything=True)
        held, self._held = self._held, []
        if held:
            self._on_batch_done([(job.token, False) for job in held])

    def _retry_held(self) -> None:
        held, self._held = self._held, []
        if self._stop.is_set():
            self._held = held
            self._release_held()
            return
        self._write(held, retrying=True)
        if self._held:
            self._held_due = time.monotonic() + self._held_backoff.next()
        else:
            self._held_backoff.reset()

    def _hold(self, job: ParkJob, *, retrying: bool) -> None:
        if not retrying:
            logger.error(
                "the database refuses the row of message %s of %s even stripped; holding it "
                "unacked (not lost) and trying again every %.0fs at most%s",
                job.request.properties.get("message_id"),
                job.request.receiver,
                HOLD_MAX_DELAY,
                f". {hint}" if (hint := missing_tables_message()) else "",
                extra=request_fields(job.request),
            )
        if not self._held:
            self._held_due = time.monotonic() + self._held_backoff.current
        self._held.append(job)

    def _write(self, batch: list[ParkJob], *, retrying: bool = False) -> None:
        backoff = CappedBackoff(0.5, 10.0)
        logged = False
        while True:
            batch = [job for job in batch if self._is_current(job.token)]
            if not batch:
                return
            try:
                stored = commit(
                    batch, self._names, self._on_stored, quiet=retrying, flood=self._flood
                )
            except DatabaseError as exc:
                if not logged:
                    logger.error(
                        "database unavailable or busy, cannot park %d message(s) (first: %s "
                        "of %s) (%s); holding them unacked and retrying",
                        len(batch),
                        batch[0].request.properties.get("message_id"),
                        batch[0].request.receiver,
                        " ".join(str(exc).split())[:200],
                    )
                    logged = True
                for conn in connections.all():
                    conn.close_if_unusable_or_obsolete()
                # A commit whose answer was lost may have stored them: write them again as
                # redeliveries, so a stored row is found, not counted twice.
                batch = [replace(j, request=replace(j.request, redelivered=True)) for j in batch]
            else:
                if logged:
                    logger.warning("database is back; parked %d held message(s)", len(batch))
                if self._hooks is not None:
                    _batch_done(self._hooks, batch, stored)
                done: list[tuple[Any, bool]] = []
                for job, ok in zip(batch, stored, strict=True):
                    if ok:
                        if retrying:
                            logger.warning(
                                "parked held message %s",
                                job.request.properties.get("message_id"),
                                extra=request_fields(job.request),
                            )
                        done.append((job.token, True))
                    else:
                        self._hold(job, retrying=retrying)
                if done:
                    self._on_batch_done(done)
                return
            if self._stop.wait(backoff.next()):  # shutting down: back to the queue
                self._on_batch_done([(job.token, False) for job in batch])
                return


def _batch_done(hooks: _hooks.Hooks, batch: list[ParkJob], stored: list[bool]) -> None:
    """Tell observability the size of a committed batch and how long its oldest row waited
    since its receiver's failure was decided."""
    times = [job.request.last_failure_at for job in batch if job.request.last_failure_at]
    lag = 0.0
    if times:
        oldest = min(times)
        lag = max(0.0, (datetime.now(oldest.tzinfo) - oldest).total_seconds())
    hooks.parked_batch(sum(stored), lag)


def commit(
    jobs: Sequence[ParkJob],
    names: Names,
    on_stored: Callable[[list[str | None]], None],
    *,
    quiet: bool = False,
    flood: FloodSummary | None = None,
) -> list[bool]:
    """Store the jobs' rows (:func:`store`), log each one parked (or, in a ``flood``, the
    first ones and a count), and report their delivery-limit rows to ``on_stored``; per
    job, whether its row is stored."""
    stored = store([job.request for job in jobs], names, quiet=quiet)
    for job, ok in zip(jobs, stored, strict=True):
        if ok and (flood is None or flood.admit(job.request.receiver)):
            logger.warning(job.log_line, extra=request_fields(job.request))
    if flood is not None:
        tell_floods(flood)
    on_stored([job.start_key for job, ok in zip(jobs, stored, strict=True) if ok])
    return stored


def tell_floods(flood: FloodSummary, *, everything: bool = False) -> None:
    """Log the parks of a flood not logged one by one (:mod:`core.floods`)."""
    for summary in flood.due(everything=everything):
        logger.warning(
            "parked %s more message(s) of %s in the last %.0f s (not logged one by one: "
            "RMQ_RETRY['PARK_LOG_INTERVAL'])",
            f"{summary.count:,}",
            summary.key,
            max(summary.seconds, 1.0),
            extra={"receiver": summary.key, "parked": summary.count},
        )


def store(requests: Sequence[ParkRequest], names: Names, *, quiet: bool = False) -> list[bool]:
    """Commit the rows of ``requests``; per request, whether its row is stored.

    Raises ``DatabaseError`` only while the database does not answer (an outage) or cannot
    write now (``core.busy``): the caller holds the batch and retries. A database that
    answers but refuses the batch refused something in one request: row by row then, so
    that one does not hold up the others, and a row it still refuses is stored stripped
    (:func:`parking.stripped_request`) rather than retried for ever. ``quiet``: a row
    already refused once is tried again; a refusal again is logged at DEBUG only (its
    holder said it once).
    """
    try:
        park_many(requests, names=names)
        return [True] * len(requests)
    except DatabaseError as exc:
        if _cannot_write(exc):
            raise
        if not quiet:
            logger.warning("the database refused a batch of %d park(s): %s", len(requests), exc)
    except Exception:
        logger.exception("internal error parking a batch of %d; row by row", len(requests))
    return [_store_one(req, names, quiet) for req in requests]


def _store_one(req: ParkRequest, names: Names, quiet: bool) -> bool:
    try:
        park(req, names=names)
        return True
    except DatabaseError as exc:
        if _cannot_write(exc):
            raise
        refusal: BaseException = exc
    except Exception as exc:  # a bug of ours with this request's data
        logger.exception(
            "cannot park message %s of %s",
            req.properties.get("message_id"),
            req.receiver,
            extra=request_fields(req),
        )
        refusal = exc
    try:
        park(stripped_request(req, refusal), names=names)
    except DatabaseError as exc:
        if _cannot_write(exc):
            raise
        (logger.debug if quiet else logger.error)(
            "cannot park message %s of %s even stripped: %s",
            req.properties.get("message_id"),
            req.receiver,
            " ".join(str(exc).split())[:200],
            extra=request_fields(req),
        )
        return False
    logger.error(
        "parked message %s of %s without its headers and properties: the database "
        "refused them (%s)",
        req.properties.get("message_id"),
        req.receiver,
        " ".join(str(refusal).split())[:200],
        extra=request_fields(req),
    )
    return True


def request_fields(req: ParkRequest) -> dict[str, Any]:
    """The message fields of a log record about the row ``req`` describes."""
    return fields(req.receiver, req.queue, req.properties, req.attempts)


def _cannot_write(exc: DatabaseError) -> bool:
    """Whether ``exc`` is the database's state, not a refusal of the row: it cannot write
    now (``core.busy``) or does not answer at all (an outage)."""
    return database_busy(exc) or not _database_answers()


def _database_answers() -> bool:
    """Whether a fresh connection runs a query: tells a refused row from an outage."""
    conn = connections[DEFAULT_DB_ALIAS]
    try:
        conn.close()
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        return False
    return True
