"""The database side of ``async def`` receivers: where their synchronous units run, and the
hygiene of the connection their own ``sync_to_async`` calls use.

The consumer's own database work for an async receiver's message (``Handler.prepare`` and
``Handler.conclude``: the delivery limit's row, the retry policy row, retry or park) runs
as one unit each on a few database threads of our own (:class:`DbThreads`), with stale
connections closed around the unit (:func:`db_unit`), as a plain receiver's thread does
around its message. The receiver's own calls run on asgiref's thread for thread-sensitive
code; :class:`ConnectionHygiene` treats each attempt as a request there. Whichever loop
awaits the receivers (``consumer.aio``: a loop of their own or the consumer's I/O loop),
none of this runs on it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created

from ..db.threads import start_daemon
from .pool import CANCELLED, Job

logger = logging.getLogger("django_rmq_retry.consumer.aio")

#: Database threads of one event loop: how many sync units (and connections) run at once.
DB_THREADS = 4
#: Seconds without an attempt after which the next one checks the connection first.
IDLE = 1.0


class DbThreads(Executor):
    """A few daemon threads for the sync units of async receivers.

    Not a ``ThreadPoolExecutor``: its threads are joined at interpreter exit and never
    close their database connections; ours are daemons that close theirs when they end
    (``threads.start_daemon``).

    :meth:`run` (the loop's own units: ``Handler.prepare``, ``Handler.conclude``) answers
    in batches: a unit that ends while the loop has not yet taken the answers before it
    joins them, so the loop wakes once per batch, not once per unit (each wake-up of a
    loop from another thread costs a write to its self-pipe and a turn of the GIL).
    ``submit`` (``Executor``: a receiver's own units, ``core.unit_threads``) answers each
    through its ``concurrent.futures.Future`` as usual.
    """

    def __init__(
        self, workers: int, name: str, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self._queue: SimpleQueue[tuple[Any, Callable[..., Any], Any, Any] | None] = SimpleQueue()
        self._loop = loop
        self._lock = threading.Lock()
        #: Answers of :meth:`run` the loop has not taken yet, and whether a wake-up is due.
        self._answers: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._waking = False
        self._threads = [start_daemon(self._work, f"{name}_{i}") for i in range(workers)]

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """On the loop: ``fn(*args)`` on one of the threads, in a copy of this context (as
        ``sync_to_async`` runs it); its answer comes back with the batch it ends in."""
        assert self._loop is not None
        future = self._loop.create_future()
        self._queue.put((future, contextvars.copy_context().run, (fn, *args), {}))
        return await future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if isinstance(future, Future):
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)
                continue
            try:
                self._answer(future, fn(*args, **kwargs), None)
            except BaseException as exc:
                self._answer(future, None, exc)

    def _answer(
        self, future: asyncio.Future[Any], result: Any, error: BaseException | None
    ) -> None:
        with self._lock:
            self._answers.append((future, result, error))
            if self._waking:
                return
            self._waking = True
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            logger.debug("database units ended after their event loop", exc_info=True)

    def _deliver(self) -> None:
        """On the loop: every answer that came in since the last wake-up."""
        with self._lock:
            answers, self._answers = self._answers, []
            self._waking = False
        for future, result, error in answers:
            if future.done():  # its job was cancelled meanwhile
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class Abandoned(Exception):
    """The job's attempt was abandoned (:meth:`AsyncPool.abandon_running`): no database
    unit starts for it any more."""


def db_unit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for ``job`` with Django's per-request hygiene around it: a connection that is
    broken or past ``CONN_MAX_AGE`` is closed before and after (as ``Consumer._process``
    does). Not started for an abandoned job (:class:`Abandoned`)."""

    def unit(job: Job, *args: Any) -> Any:
        if job.state is CANCELLED:
            raise Abandoned
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return unit


def on_loop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for ``job`` on the event loop itself, for a step that touches no database
    (``Handler.prepares_on_loop``): in a copy of the job's context, as on a database thread,
    and not for an abandoned job (:class:`Abandoned`)."""

    def here(job: Job, *args: Any) -> Any:
        if job.state is CANCELLED:
            raise Abandoned
        return contextvars.copy_context().run(fn, *args)

    return here


class ConnectionHygiene:
    """Django's request-cycle hygiene for the connection async receivers use themselves.

    ``sync_to_async`` (thread-sensitive, its default) and the async ORM run a receiver's
    database calls on one thread of asgiref's, whose connection nothing else would ever
    check: once the database dropped it, every later call failed on the dead connection and
    each message was parked. :meth:`after` each attempt (and :meth:`before` one after an
    idle second) runs ``close_old_connections`` on that same thread, as Django does around
    a request: a broken connection, or one past ``CONN_MAX_AGE``, is closed, and the next
    call connects again (with ``CONN_HEALTH_CHECKS``, checked first).

    That thread runs its calls one at a time, in order, so one pending run covers every
    attempt that ended before it starts: attempts that end meanwhile share it (under load,
    far fewer runs than attempts), and no attempt waits for it. Once the first run has
    found that thread, none runs while no connection was ever opened there (receivers that
    never touch the database, the common case of an HTTP call: nothing to check); Django's
    ``connection_created`` says when one is.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._call = sync_to_async(self._close, thread_sensitive=True)
        #: The run not started yet (attempts that end now are covered by it), if any.
        self._queued: asyncio.Task[None] | None = None
        self._last: asyncio.Task[None] | None = None
        self._ended = float("-inf")  # monotonic time the last attempt ended
        self._thread: int | None = None  # the receivers' thread, once a run found it
        self._opened_on: set[int] = set()  # threads that ever opened a connection
        connection_created.connect(self._opened)

    def _opened(self, sender: Any, **kwargs: Any) -> None:
        """Any thread, as it opens a database connection (``connection_created``)."""
        self._opened_on.add(threading.get_ident())

    def _needless(self) -> bool:
        """Whether the receivers' thread is known and has never opened a connection."""
        return self._thread is not None and self._thread not in self._opened_on

    def _close(self) -> None:
        """On the receivers' thread: attempts ending from now on need a run of their own."""
        self._queued = None
        here = threading.get_ident()
        if self._thread is None and connections.all(initialized_only=True):
            self._opened_on.add(here)  # opened before this pool listened
        self._thread = here
        try:
            close_old_connections()
        except Exception:  # never a reason to fail an attempt: the next call says more
            logger.debug("closing stale database connections failed", exc_info=True)

    async def _run(self) -> None:
        try:
            await self._call()
        except Exception:  # asgiref refused (its thread in use by this context)
            logger.debug("database connection hygiene did not run", exc_info=True)

    def _schedule(self) -> asyncio.Task[None]:
        task = self._queued
        if task is None:
            # A context of its own: where the receivers' own calls go, whatever the
            # attempt's context holds.
            coroutine: Coroutine[Any, Any, None] = self._run()
            task = contextvars.Context().run(self._loop.create_task, coroutine)
            self._queued = self._last = task
        return task

    async def before(self) -> None:
        """Before an attempt: after an idle second, drop what went stale meanwhile."""
        if time.monotonic() - self._ended > IDLE and not self._needless():
            await asyncio.shield(self._schedule())

    def after(self) -> None:
        """After an attempt: drop its connection if broken or too old (not waited for)."""
        self._ended = time.monotonic()
        if not self._needless():
            self._schedule()

    def pending(self) -> asyncio.Task[None] | None:
        task = self._last
        return task if task is not None and not task.done() else None
