"""Where a retry copy that reached its queue before its due time waits, unacked, until due.

The delay levels hold a retry delay less its last stretch (``DELAY_LANDING_MS``,
``core.delays.route``), so the copy arrives a little early whatever RabbitMQ's TTL and
dead-letter hops cost that day; the consumer holds it here and hands it to a receiver
thread when it is due. It stays a *pending* job all the while: the broker still holds it
unacked, a warm shutdown or a lost connection cancels it like any job no receiver started,
and it goes back to its queue untouched. One daemon thread sleeps until the earliest due
job; receiver threads and the consumer's loop never wait for it.

It hands a job over ``LEAD`` before its time, with every other job due by then, and the
receiver thread that takes it waits out the rest while it has nothing else to run
(``pool``); a thread that has other work gives it back, to be handed over at its time
exactly (``lead=0``). Copies that failed together come due together, a few tenths of a ms
apart: handed over one wake-up each, the landing's thread would take the interpreter lock
from the receiver thread for every copy.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from ..db.threads import start_daemon

J = TypeVar("J")
K = TypeVar("K", bound=Hashable)


#: How long before its time a job is handed over (its taker waits out the rest).
LEAD = 0.002


class Landing(Generic[J]):
    """Hands each held job to ``release`` ``lead`` before its time (earliest first)."""

    def __init__(self, release: Callable[[J], None], name: str) -> None:
        self._release = release
        self._name = name
        self._ready = threading.Condition(threading.Lock())
        self._held: list[tuple[float, int, J]] = []
        self._order = itertools.count()  # equal times leave in arrival order
        self._closed = False
        self._thread: threading.Thread | None = None

    def hold(self, job: J, at: float, lead: float | None = None) -> None:
        """Release ``job`` at ``at`` less ``lead`` (default ``LEAD``; monotonic clock)."""
        with self._ready:
            if self._closed:
                return
            early = LEAD if lead is None else lead
            heapq.heappush(self._held, (at - early, next(self._order), job))
            if self._thread is None:  # most consumers never hold one: no thread until then
                self._thread = start_daemon(self._run, self._name)
            self._ready.notify()

    def __len__(self) -> int:
        with self._ready:
            return len(self._held)

    def count_by(self, key: Callable[[J], K]) -> Counter[K]:
        """How many held jobs share each ``key`` (e.g. their queue)."""
        with self._ready:
            return Counter(key(job) for _at, _n, job in self._held)

    def close(self) -> None:
        """Release nothing more; jobs still held are dropped here (their owner cancels them)."""
        with self._ready:
            self._closed = True
            self._held.clear()
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._closed:
                    if not self._held:
                        self._ready.wait()
                        continue
                    wait = self._held[0][0] - time.monotonic()
                    if wait <= 0:
                        break
                    self._ready.wait(wait)
                if self._closed:
                    return
                now = time.monotonic()
                due = []
                while self._held and self._held[0][0] <= now:
                    due.append(heapq.heappop(self._held)[2])
            for job in due:
                self._release(job)
