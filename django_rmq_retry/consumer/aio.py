"""``async def`` receivers: one event loop per consumer process, beside the receiver threads.

A coroutine receiver is awaited on the consumer's own event loop (a daemon thread), at most
``ASYNC_CONCURRENCY`` at once per process; a thousand receivers waiting on HTTP calls cost
a thousand coroutines, not a thousand threads. Everything around the receiver that touches
the database stays synchronous, as it is for a plain receiver: what ``Handler.prepare``
does (the delivery limit's row, the retry policy row) and what ``Handler.conclude`` decides
(retry or park) each run as one unit through ``sync_to_async`` on a few database threads of
our own, with stale connections closed around the unit (Django's transactions do not work
in async code; the parked row itself is written by the parking thread, as always).

The receiver's own database calls (``sync_to_async``, the async ORM) run on asgiref's
thread for thread-sensitive code, on its connection. Each attempt is a request there, as for
a plain receiver in its thread: that connection is closed when broken or past
``CONN_MAX_AGE`` after every attempt, and before one after an idle second
(:class:`ConnectionHygiene`). So a receiver recovers when the database drops its
connections (a failover, a restart, an idle timeout) instead of failing for ever on a dead one.

Acks are the loop's as for every receiver: the job is handed back (``done``) with its
action, and the consumer's loop acks only after the retry copy is confirmed or the
parked row committed. A warm shutdown cancels jobs no coroutine has started (their
deliveries go back to the queue untouched) and lets started ones finish, as the threads do;
out of time, it abandons them (:meth:`AsyncPool.abandon_running`): each is cancelled where
it awaits, and never completes after its delivery went back.
``async def`` receivers cannot be ``idempotent=True`` (the registry refuses it).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from queue import SimpleQueue
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from ..core.unit_threads import db_executor
from ..db.threads import start_daemon
from .actions import Action, Delivery, Release
from .handler import Attempt, Handler, is_async
from .pool import CANCELLED, PENDING, RUNNING, DaemonPool, Job
from .watchdog import LoopWatchdog, receiver_codes

logger = logging.getLogger(__name__)

#: Database threads of one event loop: how many sync units (and connections) run at once.
DB_THREADS = 4
#: Seconds without an attempt after which the next one checks the connection first.
IDLE = 1.0


class DbThreads(Executor):
    """A few daemon threads for the sync units of async receivers.

    Not a ``ThreadPoolExecutor``: its threads are joined at interpreter exit and never
    close their database connections; ours are daemons that close theirs when they end
    (``threads.start_daemon``).
    """

    def __init__(self, workers: int, name: str) -> None:
        self._queue: SimpleQueue[tuple[Future[Any], Callable[..., Any], Any, Any] | None] = (
            SimpleQueue()
        )
        self._threads = [start_daemon(self._work, f"{name}_{i}") for i in range(workers)]

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class Abandoned(Exception):
    """The job's attempt was abandoned (:meth:`AsyncPool.abandon_running`): no database
    unit starts for it any more."""


def _db_unit(fn: Callable[..., Any]) -> Callable[..., Any]:
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
    far fewer runs than attempts), and no attempt waits for it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._call = sync_to_async(self._close, thread_sensitive=True)
        #: The run not started yet (attempts that end now are covered by it), if any.
        self._queued: asyncio.Task[None] | None = None
        self._last: asyncio.Task[None] | None = None
        self._ended = float("-inf")  # monotonic time the last attempt ended

    def _close(self) -> None:
        """On the receivers' thread: attempts ending from now on need a run of their own."""
        self._queued = None
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
        if time.monotonic() - self._ended > IDLE:
            await asyncio.shield(self._schedule())

    def after(self) -> None:
        """After an attempt: drop its connection if broken or too old (not waited for)."""
        self._ended = time.monotonic()
        self._schedule()

    def pending(self) -> asyncio.Task[None] | None:
        task = self._last
        return task if task is not None and not task.done() else None


class AsyncPool:
    """The event loop's side of the consumer: the same interface as ``DaemonPool``.

    ``submit`` (from the consumer's loop) schedules a job; it waits in the landing
    (``hold``) if it is a retry copy that arrived early, then for a free slot of the
    semaphore, then runs; ``done(job)`` hands it back whatever happened.
    """

    def __init__(
        self,
        concurrency: int,
        name: str,
        handler: Handler,
        done: Callable[[Job], None],
        *,
        is_current: Callable[[Delivery], bool] = lambda d: True,
        hold: Callable[[Delivery], float] | None = None,
        receivers: Iterable[Any] = (),
    ) -> None:
        self.concurrency = max(1, int(concurrency))
        self._handler = handler
        self._done = done
        self._is_current = is_current
        self._hold = hold
        self._lock = threading.Lock()  # job state changes: start vs cancel
        self._db = DbThreads(min(DB_THREADS, self.concurrency), f"{name}-db")
        # asgiref only needs an Executor's submit(); its hints name ThreadPoolExecutor.
        db = cast(ThreadPoolExecutor, self._db)
        self._prepare = sync_to_async(
            _db_unit(handler.prepare), thread_sensitive=False, executor=db
        )
        self._conclude = sync_to_async(
            _db_unit(handler.conclude), thread_sensitive=False, executor=db
        )
        self._held: dict[int, Job] = {}  # in the landing (event loop's thread only)
        #: Each job admitted and not over yet, with its task (event loop's thread only).
        self._tasks: dict[int, tuple[Job, asyncio.Task[None]]] = {}
        self._abandoned: set[int] = set()  # jobs given up while running
        self._given_up = False  # abandon_running() was called: no job starts any more
        self._running = 0
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._hygiene = ConnectionHygiene(self._loop)
        # Names a receiver that blocks the loop (``time.sleep`` in ``async def``).
        self._watchdog = LoopWatchdog(self._loop, receiver_codes(receivers), name)
        self._waited: asyncio.Task[None] | None = None  # the check whose end stops the loop
        self._ready = threading.Event()
        self._thread = start_daemon(self._run_loop, f"{name}-loop")
        self._ready.wait()

    # The loop's thread -------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._slots = asyncio.Semaphore(self.concurrency)
        self._watchdog.start()
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._watchdog.stop()
            self._loop.close()
            self._db.shutdown(wait=False)  # after the last attempt's ``conclude``

    def _admit(self, job: Job) -> None:
        if self._given_up:  # out of time: its delivery goes back untouched
            self.cancel(job)
            return
        wait = self._hold(job.delivery) if self._hold is not None else 0.0
        if wait > 0:
            self._held[id(job)] = job
            self._loop.call_later(wait, self._land, job)
        else:
            self._start(job)

    def _land(self, job: Job) -> None:
        if self._held.pop(id(job), None) is not None:
            self._start(job)

    def _start(self, job: Job) -> None:
        self._tasks[id(job)] = (job, self._loop.create_task(self._run(job)))

    async def _run(self, job: Job) -> None:
        try:
            async with self._slots:
                with self._lock:
                    if job.state is not PENDING:
                        return
                    job.state = RUNNING
                    self._running += 1
                db_executor.set(self._db)  # this job's context: the receiver's units run there
                try:
                    action: Action | None = await self._process(job)
                    error: BaseException | None = None
                except BaseException as exc:  # a cancelled job's CancelledError included
                    action, error = None, exc
                finally:
                    self._running -= 1
                if id(job) in self._abandoned:  # its delivery is given back: nothing of it
                    self._abandoned.discard(id(job))
                    return
                job.finish(action, error)
                self._done(job)
        finally:
            self._tasks.pop(id(job), None)
            self._stop_if_closed()

    async def _process(self, job: Job) -> Action:
        d = job.delivery
        if not self._is_current(d):  # its connection is gone: the broker has it back
            return Release()
        step = await self._prepare(job, d)
        if not isinstance(step, Attempt):
            return step
        # The hooks start and end the attempt in this job's own context, the receiver's: a
        # span current in the receiver (across its awaits) and in ``conclude``'s copy of it.
        handler = self._handler
        await self._hygiene.before()
        handler.observe(step)
        error = await handler.aattempt(step.receiver, step.message)
        self._hygiene.after()
        if id(job) in self._abandoned:  # cancelled in the receiver: decide nothing
            handler.observed(step, error, Release(cause="abandoned at shutdown"))
            raise Abandoned
        try:
            action = await self._conclude(job, step, error)
        except BaseException:
            if id(job) in self._abandoned:
                handler.observed(step, error, Release(cause="abandoned at shutdown"))
            raise
        handler.observed(step, error, action)
        return action

    def _stop_if_closed(self) -> None:
        """Once closing and no attempt runs: stop the loop, once the tasks still waiting
        (cancelled jobs waiting for a slot, a connection check queued) are cancelled."""
        if not self._closing or self._running:
            return
        waiting = [task for _job, task in self._tasks.values()]  # each ends by calling this
        for task in waiting:
            task.cancel()
        hygiene = self._hygiene.pending()
        if hygiene is not None:
            hygiene.cancel()
            if hygiene is not self._waited:
                self._waited = hygiene
                hygiene.add_done_callback(lambda _task: self._stop_if_closed())
            return
        if not waiting:
            self._loop.stop()

    def _abandon(self, unwound: Future[bool]) -> None:
        self._given_up = True
        for job in list(self._held.values()):
            self.cancel(job)
        self._held.clear()
        tasks = []
        for job, task in list(self._tasks.values()):
            with self._lock:
                if job.state is PENDING:  # its task ends when it gets a slot
                    job.state = CANCELLED
                elif job.state is RUNNING:
                    job.state = CANCELLED
                    self._abandoned.add(id(job))
                    task.cancel()
                    tasks.append(task)
        left = set(tasks)

        def gone(task: asyncio.Task[None]) -> None:
            left.discard(task)
            if not left and not unwound.done():
                unwound.set_result(True)

        for task in tasks:
            task.add_done_callback(gone)
        if not left:
            unwound.set_result(True)

    # Any thread --------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        self._loop.call_soon_threadsafe(self._admit, job)

    @property
    def held(self) -> int:
        return len(self._held)

    def held_by_queue(self) -> dict[str, int]:
        return dict(Counter(job.delivery.queue for job in list(self._held.values())))

    def cancel(self, job: Job) -> bool:
        with self._lock:
            if job.state is PENDING:
                job.state = CANCELLED
                return True
            return False

    def abandon_running(self, timeout: float) -> bool:
        """Give up every attempt this loop runs: a warm shutdown out of time calls it
        before the deliveries go back to the broker.

        Jobs waiting for a slot or in the landing are cancelled. A running attempt is
        cancelled where it awaits (the receiver, or ``prepare`` / ``conclude``) and its job
        marked cancelled: from then on it is never handed back (``done``), its ``conclude``
        never starts, and no database unit starts for it, so the attempt never completes
        after its delivery went back. Waits up to ``timeout`` seconds for the cancelled
        coroutines to unwind; True if they did (or none ran).

        What cannot be taken back: a synchronous call already running in a thread (a
        database unit, the receiver's own ``sync_to_async``) finishes there, and a receiver
        that catches the cancellation and goes on runs on; nothing it does is acked or
        decided (the delivery is redelivered).
        """
        if not self._thread.is_alive():
            return True
        unwound: Future[bool] = Future()
        try:
            self._loop.call_soon_threadsafe(self._abandon, unwound)
        except RuntimeError:  # the loop is closed: nothing runs
            return True
        try:
            return unwound.result(timeout=max(0.0, timeout))
        except FutureTimeout:
            return False

    def shutdown(self) -> None:
        """Warm shutdown: jobs not started are cancelled (a coroutine that gets its slot
        later finds them cancelled); started ones finish, then the loop stops."""

        def close() -> None:
            self._closing = True
            for job in list(self._held.values()):
                self.cancel(job)
            self._held.clear()
            self._stop_if_closed()

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(close)


class Pools:
    """Receiver threads and the event loop behind the one interface the loop uses:
    a delivery for an ``async def`` receiver goes to the event loop, any other to a thread."""

    def __init__(self, threads: DaemonPool, aio: AsyncPool) -> None:
        self.threads = threads
        self.aio = aio

    def _pool(self, job: Job) -> DaemonPool | AsyncPool:
        rec = job.delivery.receiver
        return self.aio if rec is not None and is_async(rec) else self.threads

    def submit(self, job: Job) -> None:
        self._pool(job).submit(job)

    def cancel(self, job: Job) -> bool:
        return self._pool(job).cancel(job)

    @property
    def held(self) -> int:
        return self.threads.held + self.aio.held

    def held_by_queue(self) -> dict[str, int]:
        return dict(Counter(self.threads.held_by_queue()) + Counter(self.aio.held_by_queue()))

    def abandon_running(self, timeout: float) -> bool:
        """The event loop's :meth:`AsyncPool.abandon_running` (a thread cannot be stopped:
        a sync receiver still running is left to finish, its delivery given back)."""
        return self.aio.abandon_running(timeout)

    def shutdown(self) -> None:
        self.threads.shutdown()
        self.aio.shutdown()


def with_event_loop(
    threads: DaemonPool,
    receivers: Iterable[Any],
    handler: Handler,
    done: Callable[[Job], None],
    *,
    concurrency: int,
    is_current: Callable[[Delivery], bool],
) -> DaemonPool | Pools:
    """``threads`` alone when no receiver is ``async def`` (no event loop is started);
    else both, each delivery to the right one."""
    coroutines = [rec for rec in receivers if is_async(rec)]
    if not coroutines:
        return threads
    aio = AsyncPool(
        concurrency,
        "rmq-async",
        handler,
        done,
        is_current=is_current,
        hold=handler.wait_before,
        receivers=coroutines,
    )
    return Pools(threads, aio)
