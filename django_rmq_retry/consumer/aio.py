"""``async def`` receivers: awaited on an event loop, beside the receiver threads.

A coroutine receiver is awaited on an event loop, at most ``ASYNC_CONCURRENCY`` at once per
process; a thousand receivers waiting on HTTP calls cost a thousand coroutines, not a
thousand threads. Which loop is the project's choice (``ASYNC_ON_IO_LOOP``): by default a
loop of their own on a daemon thread, so a receiver that blocks it never holds the broker
I/O; or the consumer's own I/O loop (``engine``), where a finished attempt is settled
without a thread switch: no hand-off to another thread, no wake-up of the I/O thread.

Everything around the receiver that touches the database stays synchronous, as for a plain
receiver, and never runs on the loop (``aio_db``): ``Handler.prepare`` and
``Handler.conclude`` each run as one unit on a few database threads of our own, with stale
connections closed around the unit, and the connection the receiver's own
``sync_to_async`` calls use is checked after each attempt as after a request.

Acks are the consumer's loop's as for every receiver: the job is handed back (``done``) with
its action, and the loop acks only after the retry copy is confirmed or the parked row
committed. A warm shutdown cancels jobs no coroutine has started (their deliveries go back
to the queue untouched) and lets started ones finish, as the threads do; out of time, it
abandons them (:meth:`AsyncPool.abandon_running`): each is cancelled where it awaits, and
never completes after its delivery went back. A receiver that blocks the loop it runs on is
named while it does (``watchdog``). ``async def`` receivers cannot be ``idempotent=True``
(the registry refuses it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..core.unit_threads import db_executor
from ..db.threads import start_daemon
from .actions import Action, Delivery, Release
from .aio_db import DB_THREADS, Abandoned, ConnectionHygiene, DbThreads, db_unit, on_loop
from .handler import Attempt, Handler, is_async
from .pool import CANCELLED, PENDING, RUNNING, DaemonPool, Job
from .watchdog import LoopWatchdog, receiver_codes

logger = logging.getLogger(__name__)

#: Seconds :meth:`AsyncPool.aclose` gives attempts still running on the consumer's loop to
#: unwind once abandoned.
UNWIND = 1.0
#: What a receiver blocking each kind of loop holds up (the watchdog's WARNING says it).
OWN_LOOP_STALLS = "every other async receiver waits"
IO_LOOP_STALLS = (
    "the consumer's broker I/O (heartbeats, acks, deliveries) and every other async receiver wait"
)


class AsyncPool:
    """The event loop's side of the consumer: the same interface as ``DaemonPool``.

    ``submit`` (from the consumer's loop) schedules a job; it waits in the landing
    (``hold``) if it is a retry copy that arrived early, then for a free slot of the
    semaphore, then runs; ``done(job)`` hands it back whatever happened.

    By default the pool runs a loop of its own on a daemon thread. With ``io_loop`` it has
    none: :meth:`start_on` gives it the consumer's loop (on that loop's thread, before a
    run), jobs are submitted on that thread, and :meth:`aclose` ends the run's side there.
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
        io_loop: bool = False,
    ) -> None:
        self.concurrency = max(1, int(concurrency))
        self.io_loop = io_loop
        self._name = name
        self._handler = handler
        self._done = done
        self._is_current = is_current
        self._hold = hold
        self._codes = receiver_codes(receivers)  # to name a receiver that blocks the loop
        self._lock = threading.Lock()  # job state changes: start vs cancel
        self._held: dict[int, Job] = {}  # in the landing (event loop's thread only)
        #: Each job admitted and not over yet, with its task (event loop's thread only).
        self._tasks: dict[int, tuple[Job, asyncio.Task[None]]] = {}
        self._abandoned: set[int] = set()  # jobs given up while running
        self._given_up = False  # abandon_running() was called: no job starts any more
        self._running = 0
        self._closing = False
        self._waited: asyncio.Task[None] | None = None  # the check whose end stops the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if not io_loop:
            self._bind(asyncio.new_event_loop(), OWN_LOOP_STALLS)
            self._ready = threading.Event()
            self._thread = start_daemon(self._run_loop, f"{name}-loop")
            self._ready.wait()

    def _bind(self, loop: asyncio.AbstractEventLoop, stalls: str) -> None:
        """The loop this pool's jobs run on, with their database threads and watchdog."""
        self._loop = loop
        self._db = DbThreads(min(DB_THREADS, self.concurrency), f"{self._name}-db", loop)
        self._prepare = functools.partial(self._db.run, db_unit(self._handler.prepare))
        self._conclude = functools.partial(self._db.run, db_unit(self._handler.conclude))
        # Either step when it touches no database (``Handler.prepares_on_loop``): run here.
        self._prepare_here = on_loop(self._handler.prepare)
        self._conclude_here = on_loop(self._handler.conclude)
        self._hygiene = ConnectionHygiene(loop)
        self._watchdog = LoopWatchdog(loop, self._codes, self._name, stalls=stalls)

    @property
    def _on(self) -> asyncio.AbstractEventLoop:
        """The loop the jobs run on (``io_loop``: once :meth:`start_on` gave it)."""
        assert self._loop is not None, "an io_loop pool runs once start_on() gave it a loop"
        return self._loop

    # The loop's thread -------------------------------------------------------------------
    def _run_loop(self) -> None:
        assert self._loop is not None
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

    def start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """``io_loop``: run this consumer's async receivers on ``loop`` (the consumer's I/O
        loop), from now until :meth:`aclose`. On the loop's thread, before it runs."""
        assert self.io_loop
        self._bind(loop, IO_LOOP_STALLS)
        self._slots = asyncio.Semaphore(self.concurrency)
        self._abandoned.clear()
        self._given_up = self._closing = False
        self._waited = None
        self._watchdog.start()

    async def aclose(self) -> None:
        """``io_loop``, on the loop, as the consumer's run ends (its deliveries are back
        with the broker, or about to be): an attempt still running is abandoned, so it
        never completes now; what it left is given :data:`UNWIND` seconds to unwind, then
        the watchdog and the database threads stop."""
        self._closing = True
        unwound: Future[bool] = Future()
        self._abandon(unwound)
        left = [task for _job, task in self._tasks.values()]
        hygiene = self._hygiene.pending()
        if hygiene is not None:
            left.append(hygiene)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=UNWIND)
        self._watchdog.stop()
        self._db.shutdown(wait=False)

    def _admit(self, job: Job) -> None:
        if self._given_up:  # out of time: its delivery goes back untouched
            self.cancel(job)
            return
        wait = self._hold(job.delivery) if self._hold is not None else 0.0
        if wait > 0:
            self._held[id(job)] = job
            self._on.call_later(wait, self._land, job)
        else:
            self._start(job)

    def _land(self, job: Job) -> None:
        if self._held.pop(id(job), None) is not None:
            self._start(job)

    def _start(self, job: Job) -> None:
        self._tasks[id(job)] = (job, self._on.create_task(self._run(job)))

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
        handler = self._handler
        if handler.prepares_on_loop(d):
            step = self._prepare_here(job, d)
        else:
            step = await self._prepare(job, d)
        if not isinstance(step, Attempt):
            return step
        # The hooks start and end the attempt in this job's own context, the receiver's: a
        # span current in the receiver (across its awaits) and in ``conclude``'s copy of it.
        await self._hygiene.before()
        handler.observe(step)
        error = await handler.aattempt(step.receiver, step.message)
        self._hygiene.after()
        if id(job) in self._abandoned:  # cancelled in the receiver: decide nothing
            handler.observed(step, error, Release(cause="abandoned at shutdown"))
            raise Abandoned
        try:
            if handler.concludes_on_loop(step, error):
                action = self._conclude_here(job, step, error)
            else:
                action = await self._conclude(job, step, error)
        except BaseException:
            if id(job) in self._abandoned:
                handler.observed(step, error, Release(cause="abandoned at shutdown"))
            raise
        handler.observed(step, error, action)
        return action

    def _stop_if_closed(self) -> None:
        """Once closing and no attempt runs: stop the loop, once the tasks still waiting
        (cancelled jobs waiting for a slot, a connection check queued) are cancelled. Not
        the consumer's loop (``io_loop``): the consumer ends that one."""
        if self.io_loop or not self._closing or self._running:
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
            self._on.stop()

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
        """Schedule ``job`` (``io_loop``: called on the consumer's loop, its own thread)."""
        if self.io_loop:
            self._admit(job)
        else:
            self._on.call_soon_threadsafe(self._admit, job)

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

        Never on the loop's own thread: it waits for that loop (the consumer calls it from
        a worker thread, ``run_in_executor``, whichever loop runs the receivers).
        """
        loop = self._loop
        if loop is None or (self._thread is not None and not self._thread.is_alive()):
            return True
        unwound: Future[bool] = Future()
        try:
            loop.call_soon_threadsafe(self._abandon, unwound)
        except RuntimeError:  # the loop is closed: nothing runs
            return True
        try:
            return unwound.result(timeout=max(0.0, timeout))
        except FutureTimeout:
            return False

    def shutdown(self) -> None:
        """Warm shutdown: jobs not started are cancelled (a coroutine that gets its slot
        later finds them cancelled); started ones finish, then the loop stops. Nothing
        for ``io_loop``: :meth:`aclose` ended its side of the consumer's loop."""
        if self.io_loop:
            return

        def close() -> None:
            self._closing = True
            for job in list(self._held.values()):
                self.cancel(job)
            self._held.clear()
            self._stop_if_closed()

        if not self._on.is_closed():
            self._on.call_soon_threadsafe(close)


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
    io_loop: bool = False,
) -> DaemonPool | Pools:
    """``threads`` alone when no receiver is ``async def`` (no event loop is started);
    else both, each delivery to the right one (``io_loop``: the async receivers on the
    consumer's loop, once it gives it: :meth:`AsyncPool.start_on`)."""
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
        io_loop=io_loop,
    )
    return Pools(threads, aio)
