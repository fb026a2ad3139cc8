"""``async def`` receivers: one event loop per consumer process, beside the receiver threads.

A coroutine receiver is awaited on the consumer's own event loop (a daemon thread), at most
``ASYNC_CONCURRENCY`` at once per process; a thousand receivers waiting on HTTP calls cost
a thousand coroutines, not a thousand threads. Everything around the receiver that touches
the database stays synchronous, as it is for a plain receiver: what ``Handler.prepare``
does (the delivery limit's row, the retry policy row) and what ``Handler.conclude`` decides
(retry or park) each run as one unit through ``sync_to_async`` on a few database threads of
our own, with stale connections closed around the unit (Django's transactions do not work
in async code; the parked row itself is written by the parking thread, as always).

Acks are the loop's as for every receiver: the job is handed back (``done``) with its
action, and the connection's thread acks only after the retry copy is confirmed or the
parked row committed. A warm shutdown cancels jobs no coroutine has started (their
deliveries go back to the queue untouched) and lets started ones finish, as the threads do.
``async def`` receivers cannot be ``idempotent=True`` (the registry refuses it).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from queue import SimpleQueue
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from ..core.unit_threads import db_executor
from ..db.threads import start_daemon
from .actions import Action, Delivery, Release
from .handler import Attempt, Handler, is_async
from .pool import CANCELLED, PENDING, RUNNING, DaemonPool, Job

#: Database threads of one event loop: how many sync units (and connections) run at once.
DB_THREADS = 4


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


def _db_unit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with Django's per-request hygiene around it: a connection that is broken or
    past ``CONN_MAX_AGE`` is closed before and after (as ``Consumer._process`` does)."""

    def unit(*args: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return unit


class AsyncPool:
    """The event loop's side of the consumer: the same interface as ``DaemonPool``.

    ``submit`` (from the connection's thread) schedules a job; it waits in the landing
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
        self._running = 0
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = start_daemon(self._run_loop, f"{name}-loop")
        self._ready.wait()

    # The loop's thread -------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._slots = asyncio.Semaphore(self.concurrency)
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _admit(self, job: Job) -> None:
        wait = self._hold(job.delivery) if self._hold is not None else 0.0
        if wait > 0:
            self._held[id(job)] = job
            self._loop.call_later(wait, self._land, job)
        else:
            self._loop.create_task(self._run(job))

    def _land(self, job: Job) -> None:
        self._held.pop(id(job), None)
        self._loop.create_task(self._run(job))

    async def _run(self, job: Job) -> None:
        async with self._slots:
            with self._lock:
                if job.state is not PENDING:
                    return
                job.state = RUNNING
                self._running += 1
            db_executor.set(self._db)  # this job's context: the receiver's units run there
            try:
                job.finish(await self._process(job.delivery), None)
            except BaseException as exc:
                job.finish(None, exc)
            finally:
                self._running -= 1
            self._done(job)
            if self._closing and self._running == 0:
                self._loop.stop()

    async def _process(self, d: Delivery) -> Action:
        if not self._is_current(d):  # its connection is gone: the broker has it back
            return Release()
        step = await self._prepare(d)
        if not isinstance(step, Attempt):
            return step
        # The hooks start and end the attempt in this job's own context, the receiver's: a
        # span current in the receiver (across its awaits) and in ``conclude``'s copy of it.
        handler = self._handler
        handler.observe(step)
        error = await handler.aattempt(step.receiver, step.message)
        action = await self._conclude(step, error)
        handler.observed(step, error, action)
        return action

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

    def shutdown(self) -> None:
        """Warm shutdown: jobs not started are cancelled (a coroutine that gets its slot
        later finds them cancelled); started ones finish, then the loop stops."""

        def close() -> None:
            self._closing = True
            for job in list(self._held.values()):
                self.cancel(job)
            self._held.clear()
            if self._running == 0:
                self._loop.stop()

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(close)
        self._db.shutdown(wait=False)


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
    if not any(is_async(rec) for rec in receivers):
        return threads
    aio = AsyncPool(
        concurrency,
        "rmq-async",
        handler,
        done,
        is_current=is_current,
        hold=handler.wait_before,
    )
    return Pools(threads, aio)
