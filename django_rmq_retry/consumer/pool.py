"""The receiver threads: a fixed pool of daemon threads running deliveries as jobs.

Receivers never run on the consumer's loop, so a slow receiver never starves
heartbeats. A job moves pending → running → done, or pending → cancelled (a warm shutdown
returns deliveries no receiver started to their queue untouched). A retry copy that arrived
before its due time stays pending in the ``landing`` until then, and in the last
``landing.LEAD`` with a receiver thread that has nothing else to run (``_next``).

Finished jobs go back to the consumer's loop through a :class:`HandBack`, in batches:
one wake-up of that thread per batch, never one per message.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from queue import Empty, SimpleQueue

from ..db.threads import start_daemon
from .actions import Action, Delivery
from .landing import Landing

PENDING, RUNNING, DONE, CANCELLED = "pending", "running", "done", "cancelled"
#: The consumer's loop wakes once per this fraction of the prefetch window of outcomes
#: (or sooner, when a receiver thread runs out of work): see :class:`HandBack`.
HAND_BACK_SHARE = 4


class Job:
    """One delivery's trip through a worker thread.

    What ``concurrent.futures.Future`` would do, without its per-object ``Condition``
    and callback machinery: nobody waits on a job, the worker hands it back once done.
    """

    __slots__ = ("action", "delivery", "error", "not_before", "state")

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery
        self.state = PENDING
        self.action: Action | None = None
        self.error: BaseException | None = None
        self.not_before = 0.0  # monotonic time before which no thread may start it

    def finish(self, action: Action | None, error: BaseException | None) -> None:
        self.action, self.error, self.state = action, error, DONE

    def result(self) -> Action:
        if self.error is not None:
            raise self.error
        assert self.action is not None
        return self.action


class HandBack:
    """Finished jobs on their way to the consumer's loop, which wakes once per batch.

    A wake-up costs that thread an event dispatch, the GIL and an ack frame; a busy queue
    would pay it per message. So threads :meth:`put` jobs, and ``wake()`` (which schedules a
    :meth:`take` on the consumer's loop) runs at most once at a time: once ``every``
    jobs were put since the last wake-up, at once for ``put(now=True)``, or when a receiver
    thread is about to wait for work (:meth:`idle`: nothing it finished waits for a batch
    that is not coming). What a wake-up that never ran leaves behind, the connection's
    loop takes on its next tick (a safety net: ``bool(hand_back)`` says whether any).
    """

    def __init__(self, every: int, wake: Callable[[], None]) -> None:
        self.every = max(1, every)
        self._wake = wake
        self._jobs: deque[Job] = deque()  # append and popleft are atomic: no lock needed
        self._lock = threading.Lock()
        self._pending = False  # a wake-up is scheduled and has not taken the jobs yet
        self._since = 0  # jobs put since the last wake-up

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def put(self, job: Job, *, now: bool = False) -> None:
        """Any thread: queue ``job``; wake the consumer's loop if the batch is full."""
        self._jobs.append(job)
        self._queued(1, now)

    def put_batch(self, jobs: list[Job]) -> None:
        """Any thread: queue a batch that is complete (a commit's rows): one wake-up."""
        if jobs:
            self._jobs.extend(jobs)
            self._queued(len(jobs), True)

    def _queued(self, count: int, now: bool) -> None:
        with self._lock:
            self._since += count
            if self._pending or (not now and self._since < self.every):
                return
            self._pending, self._since = True, 0
        self._wake()

    def idle(self) -> None:
        """A receiver thread is about to wait for work: wake for what is queued."""
        with self._lock:
            if self._pending or not self._since:
                return
            self._pending, self._since = True, 0
        self._wake()

    def take(self) -> list[Job]:
        """The consumer's loop: every job queued (a job put meanwhile wakes again later)."""
        with self._lock:
            self._pending, self._since = False, 0
        jobs = self._jobs
        return [jobs.popleft() for _ in range(len(jobs))]

    def reset(self) -> None:
        """A new connection: a wake-up scheduled on the one before is gone with it."""
        with self._lock:
            self._pending, self._since = False, 0


class DaemonPool:
    """A fixed pool of *daemon* receiver threads: ``run(delivery)``, then ``done(job)``;
    ``idle()`` before a thread waits for the next job.

    ``ThreadPoolExecutor`` threads are joined at interpreter exit, so a receiver still
    running after ``SHUTDOWN_TIMEOUT`` would hold the process until it returned. Daemon
    threads let the process exit on time; the abandoned deliveries were never acked, so the
    broker redelivers them.
    """

    def __init__(
        self,
        workers: int,
        name: str,
        run: Callable[[Delivery], Action],
        done: Callable[[Job], None],
        hold: Callable[[Delivery], float] | None = None,
        idle: Callable[[], None] | None = None,
    ) -> None:
        self._run = run
        self._done = done
        self._idle = idle
        self._hold = hold  # seconds a delivery waits before a thread may start it
        self._lock = threading.Lock()  # job state changes: start vs cancel
        self._queue: SimpleQueue[Job | None] = SimpleQueue()
        self._landing: Landing[Job] = Landing(self._queue.put, f"{name}-landing")
        self._order = itertools.count()
        # With one thread no other could start a job this one holds early; with more, a
        # thread that starts a job first gives back what it holds (``_next``).
        self._alone = max(1, workers) == 1
        self._threads = [start_daemon(self._loop, f"{name}_{i}") for i in range(max(1, workers))]

    def submit(self, job: Job) -> None:
        wait = self._hold(job.delivery) if self._hold is not None else 0.0
        if wait > 0:
            job.not_before = time.monotonic() + wait
            self._landing.hold(job, job.not_before)
        else:
            self._queue.put(job)

    @property
    def held(self) -> int:
        """Jobs waiting in the landing for their due time."""
        return len(self._landing)

    def held_by_queue(self) -> dict[str, int]:
        """Jobs waiting in the landing, per queue of their delivery."""
        return dict(self._landing.count_by(lambda job: job.delivery.queue))

    def cancel(self, job: Job) -> bool:
        """Cancel a job no worker has started (it goes back to the queue untouched)."""
        with self._lock:
            if job.state is PENDING:
                job.state = CANCELLED
                return True
            return False

    def _next(self, early: list[tuple[float, int, Job]]) -> Job | None:
        """The next job this thread may start now (``None``: time to exit).

        Jobs the landing handed over before their time wait in ``early`` while this thread
        has nothing else to run; the earliest starts at its time. A job that may start now
        sends them back to the landing, to be handed over at their time exactly (by then
        another thread may be free, or this one done): a copy never waits for a receiver,
        and a thread never idles while work waits.
        """
        while True:
            if early:
                wait = early[0][0] - time.monotonic()
                if wait <= 0:
                    job = heapq.heappop(early)[2]
                    if not self._alone:
                        self._give_back(early)
                    return job
                try:
                    got = self._get(wait)
                except Empty:
                    continue
            else:
                got = self._get(None)
            if got is not None and got.not_before and (early or got.not_before > time.monotonic()):
                # Not due yet, or due beside copies held here that may be due before it
                # (a host that stalled this thread): the earliest leaves first.
                heapq.heappush(early, (got.not_before, next(self._order), got))
                continue
            self._give_back(early)
            return got

    def _get(self, timeout: float | None) -> Job | None:
        """The next queued job, waiting up to ``timeout`` (``None``: for ever) if there is
        none yet; ``idle()`` runs before the wait."""
        try:
            return self._queue.get_nowait()
        except Empty:
            if self._idle is not None:
                self._idle()
            return self._queue.get(timeout=timeout)

    def _give_back(self, early: list[tuple[float, int, Job]]) -> None:
        for at, _n, job in early:
            self._landing.hold(job, at, lead=0)
        early.clear()

    def _loop(self) -> None:
        early: list[tuple[float, int, Job]] = []
        while True:
            job = self._next(early)
            if job is None:
                return
            with self._lock:
                if job.state is not PENDING:
                    continue
                job.state = RUNNING
            try:
                job.finish(self._run(job.delivery), None)
            except BaseException as exc:
                job.finish(None, exc)
            self._done(job)

    def shutdown(self) -> None:
        """Cancel queued jobs and let every thread exit after its current one."""
        self._landing.close()
        while True:
            try:
                job = self._queue.get_nowait()
            except Empty:
                break
            if job is not None:
                self.cancel(job)
        for _ in self._threads:
            self._queue.put(None)
