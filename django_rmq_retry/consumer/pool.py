"""The receiver threads: a fixed pool of daemon threads running deliveries as jobs.

Receivers never run on the connection's thread, so a slow receiver never starves
heartbeats. A job moves pending → running → done, or pending → cancelled (a warm shutdown
returns deliveries no receiver started to their queue untouched). A retry copy that arrived
before its due time stays pending in the ``landing`` until then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import Empty, SimpleQueue

from ..threads import start_daemon
from .actions import Action, Delivery
from .landing import Landing

PENDING, RUNNING, DONE, CANCELLED = "pending", "running", "done", "cancelled"


class Job:
    """One delivery's trip through a worker thread.

    What ``concurrent.futures.Future`` would do, without its per-object ``Condition``
    and callback machinery: nobody waits on a job, the worker hands it back once done.
    """

    __slots__ = ("action", "delivery", "error", "state")

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery
        self.state = PENDING
        self.action: Action | None = None
        self.error: BaseException | None = None

    def finish(self, action: Action | None, error: BaseException | None) -> None:
        self.action, self.error, self.state = action, error, DONE

    def result(self) -> Action:
        if self.error is not None:
            raise self.error
        assert self.action is not None
        return self.action


class DaemonPool:
    """A fixed pool of *daemon* receiver threads: ``run(delivery)``, then ``done(job)``.

    ``ThreadPoolExecutor`` threads are joined at interpreter exit, so a receiver still
    running after ``SHUTDOWN_TIMEOUT`` held the process until it returned (scenario 5 of the
    fault suite: timeout 2 s, exit after 8 s). Daemon threads let the process exit on time;
    the abandoned deliveries were never acked, so the broker redelivers them.
    """

    def __init__(
        self,
        workers: int,
        name: str,
        run: Callable[[Delivery], Action],
        done: Callable[[Job], None],
        hold: Callable[[Delivery], float] | None = None,
    ) -> None:
        self._run = run
        self._done = done
        self._hold = hold  # seconds a delivery waits before a thread may start it
        self._lock = threading.Lock()  # job state changes: start vs cancel
        self._queue: SimpleQueue[Job | None] = SimpleQueue()
        self._landing: Landing[Job] = Landing(self._queue.put, f"{name}-landing")
        self._threads = [start_daemon(self._loop, f"{name}_{i}") for i in range(max(1, workers))]

    def submit(self, job: Job) -> None:
        wait = self._hold(job.delivery) if self._hold is not None else 0.0
        if wait > 0:
            self._landing.hold(job, wait)
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

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
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
