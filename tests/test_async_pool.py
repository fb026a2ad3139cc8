"""The event loop of ``async def`` receivers (``consumer.aio.AsyncPool``) giving up its
attempts: a warm shutdown out of time abandons them before their deliveries go back, and an
abandoned attempt never completes afterwards (no ``conclude``, no hand-back, no ack).

The pool is driven with a handler of the test's own (the receiver part only): what is
tested is the pool's bookkeeping, which needs neither broker nor database.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from django_rmq_retry.consumer.actions import HANDLED, Delivery, Release
from django_rmq_retry.consumer.aio import AsyncPool
from django_rmq_retry.consumer.handler import Attempt
from django_rmq_retry.consumer.pool import CANCELLED, Job
from tests.waiting import until


class Receivers:
    """``Handler``'s part the pool calls: each attempt awaits ``release`` (never set unless
    the test says so), ``prepare`` may be held in its database thread."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.running = 0
        self.release = asyncio.Event()
        self.prepare_gate = threading.Event()
        self.prepare_gate.set()
        self.preparing = threading.Event()

    def prepare(self, d: Delivery) -> Attempt:
        self.preparing.set()
        self.prepare_gate.wait(60)
        self.events.append(("prepared", d.tag))
        return Attempt(d, None, None, d.tag, None)  # type: ignore[arg-type]

    def prepares_on_loop(self, d: Delivery) -> bool:
        return False  # its database threads: where the test holds ``prepare``

    def concludes_on_loop(self, step: Attempt, error: BaseException | None) -> bool:
        return False

    def observe(self, step: Attempt) -> None:
        self.events.append(("observe", step.message))

    async def aattempt(self, _rec: Any, message: Any) -> BaseException | None:
        self.running += 1
        try:
            await self.release.wait()
        except BaseException as exc:  # as Handler.aattempt: what it raised is the outcome
            return exc
        finally:
            self.running -= 1
        self.events.append(("finished", message))
        return None

    def conclude(self, step: Attempt, error: BaseException | None) -> Any:
        self.events.append(("concluded", step.message))
        return HANDLED

    def observed(self, step: Attempt, error: BaseException | None, action: Any) -> None:
        self.events.append(("observed", (step.message, type(error).__name__, action)))


def delivery(tag: int) -> Delivery:
    return Delivery("q", None, "", "k", False, {}, b"{}", tag=tag)


def test_abandoned_attempts_are_cancelled_and_never_complete():
    handler = Receivers()
    handed_back: list[Job] = []
    pool = AsyncPool(4, "t-abandon", handler, handed_back.append)  # type: ignore[arg-type]
    jobs = [Job(delivery(tag)) for tag in range(6)]  # 4 run, 2 wait for a slot
    for job in jobs:
        pool.submit(job)
    until("4 attempts awaiting", lambda: handler.running == 4)

    assert pool.abandon_running(timeout=60) is True  # every cancelled coroutine unwound
    assert {job.state for job in jobs} == {CANCELLED}
    late = Job(delivery(9))
    pool.submit(late)  # admitted after: never starts, its delivery goes back untouched
    pool.shutdown()
    until("the loop stopped", lambda: not pool._thread.is_alive())

    assert handed_back == []
    kinds = [kind for kind, _what in handler.events]
    assert "finished" not in kinds and "concluded" not in kinds
    observed = [what for kind, what in handler.events if kind == "observed"]
    assert sorted(tag for tag, _error, _action in observed) == [0, 1, 2, 3]
    assert {error for _tag, error, _action in observed} == {"CancelledError"}
    assert {type(action) for _tag, _error, action in observed} == {Release}
    assert late.state is CANCELLED


def test_an_attempt_abandoned_in_its_database_unit_is_never_handed_back():
    handler = Receivers()
    handler.prepare_gate.clear()  # prepare holds its database thread
    handed_back: list[Job] = []
    pool = AsyncPool(1, "t-abandon-db", handler, handed_back.append)  # type: ignore[arg-type]
    job = Job(delivery(1))
    pool.submit(job)
    until("prepare running in its thread", handler.preparing.is_set)

    assert pool.abandon_running(timeout=60) is True  # the coroutine unwound at once
    handler.prepare_gate.set()  # the unit in its thread finishes: nothing follows it
    until("prepare returned", lambda: ("prepared", 1) in handler.events)
    pool.shutdown()
    until("the loop stopped", lambda: not pool._thread.is_alive())
    assert handed_back == []
    assert [kind for kind, _what in handler.events] == ["prepared"]
    assert job.state is CANCELLED


def test_without_abandoning_a_started_attempt_finishes_and_is_handed_back():
    handler = Receivers()
    handed_back: list[Job] = []
    pool = AsyncPool(2, "t-finish", handler, handed_back.append)  # type: ignore[arg-type]
    job = Job(delivery(1))
    pool.submit(job)
    until("the attempt awaiting", lambda: handler.running == 1)
    pool.shutdown()  # a warm shutdown in time: the attempt goes on
    asyncio.run_coroutine_threadsafe(_set(handler.release), pool._loop).result(60)
    until("the loop stopped", lambda: not pool._thread.is_alive())
    assert handed_back == [job] and job.result() is HANDLED
    assert [kind for kind, _what in handler.events] == [
        "prepared",
        "observe",
        "finished",
        "concluded",
        "observed",
    ]


async def _set(event: asyncio.Event) -> None:
    event.set()
