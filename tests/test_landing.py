"""The landing: the last stretch of a retry delay held by the consumer, not the delay levels.

A retry copy reaches its queue up to ``DELAY_LANDING_MS`` (rounded up to whole resolution
units) before its due time; the consumer holds it, unacked, and its receiver runs when it is
due, never before. Against the real broker, with messages counted end to end.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Retry, Topic
from django_rmq_retry.checks import check_settings
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.consumer import landing as landing_module
from django_rmq_retry.consumer.landing import LEAD, Landing
from django_rmq_retry.consumer.pool import DaemonPool, Job
from django_rmq_retry.consumer.spare import SPARE_LINGER_S, SpareWindows
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import default_registry
from tests.conftest import wait_for


# The landing on its own (no broker) ---------------------------------------------------------
def test_held_jobs_leave_in_due_order_one_lead_before_their_time():
    out: list[tuple[str, float]] = []
    done = threading.Event()

    def release(job: tuple[str, float]) -> None:
        out.append((job[0], time.monotonic() - job[1]))
        if len(out) == 3:
            done.set()

    landing: Landing[tuple[str, float]] = Landing(release, "test-landing")
    # All three due a second on: held in any order while none is due yet, however slowly
    # the host runs the three calls.
    start = time.monotonic() + 1.0
    landing.hold(("late", start + 0.2), start + 0.2)
    landing.hold(("early", start), start)
    landing.hold(("middle", start + 0.1), start + 0.1)
    assert done.wait(60)
    assert [name for name, _ in out] == ["early", "middle", "late"]
    # handed over no sooner than LEAD before its time (its taker waits out the rest)
    assert all(late_by >= -LEAD for _, late_by in out), out
    assert len(landing) == 0


def test_a_closed_landing_releases_nothing_more():
    out: list[str] = []
    landing: Landing[str] = Landing(out.append, "test-landing")
    landing.hold("held", time.monotonic() + 0.2)
    landing.close()
    landing.hold("after close", time.monotonic())
    time.sleep(0.4)
    assert out == [] and len(landing) == 0


def test_a_held_job_starts_at_its_time_not_when_the_landing_hands_it_over():
    """The landing hands a job over LEAD early; the receiver thread waits out the rest.
    Ten jobs due 0.1 ms apart (copies that failed together), and one due later alone."""
    started: dict[int, float] = {}
    finished = threading.Event()
    due: dict[int, float] = {}

    def run(d: int) -> Any:
        started[d] = time.monotonic()
        return None

    def done(job: Job) -> None:
        if len(started) == len(due):
            finished.set()

    base = time.monotonic() + 1.0  # none due before all are submitted, on any host
    due.update({i: base + i * 0.0001 for i in range(10)})
    due[10] = base + 0.2
    pool = DaemonPool(1, "test-pool", run, done, hold=lambda d: due[d] - time.monotonic())
    jobs = {i: Job(i) for i in due}  # type: ignore[arg-type]
    try:
        for job in jobs.values():
            pool.submit(job)
        assert finished.wait(60)
    finally:
        pool.shutdown()
    # In the order of the times the pool took (``hold`` is read as seconds from now, so a
    # host that stalls between two calls shifts a time later, never earlier), none early.
    by_time = sorted(due, key=lambda i: jobs[i].not_before)
    assert sorted(started, key=started.__getitem__) == by_time
    assert all(started[i] >= due[i] for i in due), {i: started[i] - due[i] for i in due}


def _pool_run(started: dict[str, tuple[float, str]], gates: dict[str, threading.Event]) -> Any:
    """A pool's ``run`` that notes when and on which thread each job started, then waits
    for its gate (if it has one) to open; ``done`` is a no-op."""

    def run(d: str) -> None:
        started[d] = (time.monotonic(), threading.current_thread().name)
        if d in gates:
            assert gates[d].wait(60), f"{d}'s gate never opened"

    def done(job: Job) -> None:
        pass

    return run, done


def _with_the_copy_early(pool: DaemonPool) -> bool:
    """Whether the landing handed the copy over and a thread took it (it waits out the rest
    of its time with it); polled with a generous deadline."""
    return wait_for(lambda: pool.held == 0 and pool._queue.empty(), timeout=30)


def test_a_thread_holding_a_copy_early_runs_fresh_work_at_once(monkeypatch):
    """One thread holds a copy handed over early; a fresh delivery arrives: it runs at once,
    and the copy goes back to the landing until its time. The lead is stretched to a minute
    and the copy is due in one: a thread that waited with the copy would start the fresh
    delivery a minute late, whatever the host's speed (nothing here races a clock)."""
    monkeypatch.setattr(landing_module, "LEAD", 60.0)
    started: dict[str, tuple[float, str]] = {}
    run, done = _pool_run(started, {})
    due = time.monotonic() + 60.0
    pool = DaemonPool(1, "test-pool", run, done, hold=lambda d: due - time.monotonic())
    try:
        pool.submit(Job("copy"))  # type: ignore[arg-type]
        assert _with_the_copy_early(pool)
        pool._hold = None  # the next delivery is fresh: no wait
        pool.submit(Job("fresh"))  # type: ignore[arg-type]
        assert wait_for(lambda: "fresh" in started, timeout=30), started
        assert "copy" not in started  # not run before its time
        assert wait_for(lambda: pool.held == 1, timeout=30)  # given back to the landing
    finally:
        pool.shutdown()


def test_a_copy_held_early_goes_to_whichever_thread_is_free_at_its_time(monkeypatch):
    """Thread X runs a blocker; thread Y holds a copy handed over early, then takes a fresh
    delivery that runs until the test lets it finish: Y gives the copy back, and X starts
    it once free and the copy due, while Y still runs the fresh one. The copy is due 3 s
    after it is submitted; the blocker and the fresh one end on the test's word, not a
    clock (only a host stalled past those 3 s before the fresh delivery arrives would
    see Y start the copy itself)."""
    monkeypatch.setattr(landing_module, "LEAD", 30.0)
    started: dict[str, tuple[float, str]] = {}
    gates = {"blocker": threading.Event(), "fresh": threading.Event()}
    run, done = _pool_run(started, gates)
    holds = {"blocker": False, "copy": True, "fresh": False}
    pool = DaemonPool(2, "test-pool", run, done, hold=lambda d: holds[d] and due - time.monotonic())
    try:
        pool.submit(Job("blocker"))  # type: ignore[arg-type]
        assert wait_for(lambda: "blocker" in started, timeout=30)
        due = time.monotonic() + 3.0
        pool.submit(Job("copy"))  # type: ignore[arg-type]
        assert _with_the_copy_early(pool)
        pool.submit(Job("fresh"))  # type: ignore[arg-type]
        assert wait_for(lambda: "fresh" in started, timeout=30), started
        gates["blocker"].set()  # X is free; Y runs the fresh one until told
        assert wait_for(lambda: "copy" in started, timeout=60), started
        assert not gates["fresh"].is_set()  # the copy did not wait for Y
    finally:
        for gate in gates.values():
            gate.set()
        pool.shutdown()
    assert started["copy"][0] >= due  # never before its time
    assert started["copy"][1] == started["blocker"][1] != started["fresh"][1]


@pytest.mark.parametrize("value", [-1, 10_001, 1.5, "50", None, True])
def test_a_landing_out_of_range_is_refused_by_check(value):
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "DELAY_LANDING_MS": value}):
        ids = [m.id for m in check_settings()]
    assert "django_rmq_retry.E014" in ids


@pytest.mark.parametrize("value", [0, 50, 10_000])
def test_a_landing_in_range_passes_check(value):
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "DELAY_LANDING_MS": value}):
        ids = [m.id for m in check_settings()]
    assert "django_rmq_retry.E014" not in ids


# When to widen a window (no broker) ---------------------------------------------------------
def test_by_default_no_spare_ever_starts():
    """PREFETCH is the bound unless SPARE_PREFETCH opts in."""
    spares = SpareWindows(prefetch=2)
    assert not spares.worth_deciding(1_000)
    assert spares.decide({"q": 1_000}, now=0.0).start == ()


def test_a_spare_starts_once_held_copies_fill_half_a_window_and_leaves_after_lingering():
    spares = SpareWindows(prefetch=20, spare_prefetch=80)
    assert spares.spare_prefetch == 80
    assert not spares.worth_deciding(9) and spares.worth_deciding(10)
    assert not spares.decide({"q": 9}, now=0.0).start  # under half the window
    moves = spares.decide({"q": 10, "other": 3}, now=0.0)
    assert moves.start == ("q",) and moves.cancel == ()
    spares.started("q", "tag-q", now=0.0)
    assert not spares.decide({"q": 40}, now=0.5).start  # one spare per queue at most
    assert not spares.decide({}, now=0.5 + SPARE_LINGER_S / 2).cancel  # still lingering
    assert spares.decide({}, now=0.5 + SPARE_LINGER_S).cancel == ("tag-q",)
    assert spares.forget("tag-q") == "q" and not spares.tags
    assert spares.forget("tag-q") is None  # a main consumer's tag is not ours


def test_a_spare_stays_while_its_queue_holds_copies():
    spares = SpareWindows(prefetch=1, spare_prefetch=4)
    assert spares.decide({"q": 1}, now=0.0).start == ("q",)
    spares.started("q", "t", now=0.0)
    for second in range(1, 5):  # copies keep landing: the spare is never cancelled
        assert spares.decide({"q": 1}, now=float(second)).cancel == ()
    assert spares.decide({}, now=4.0 + SPARE_LINGER_S).cancel == ("t",)
    spares.reset()
    assert not spares.tags and not spares.last_held


# Against the real broker ---------------------------------------------------------------------
def _with(**changes):
    """The current settings (the ``rmq`` fixture's prefix) with ``changes``."""
    return override_settings(RMQ_RETRY={**settings.RMQ_RETRY, **changes})


def _failing_once(topic: Topic, delay: float, runs: list[dict]) -> None:
    """A receiver that records each run and asks for one retry after ``delay`` seconds."""

    @topic.connect
    def landing_probe(message, **kwargs):
        runs.append(
            {
                "attempt": message.attempt,
                "ms": time.time() * 1000,
                "due": message.headers.get(f"{settings.RMQ_RETRY['PREFIX']}-due"),
                "deaths": [d["queue"] for d in message.headers.get("x-death", [])],
            }
        )
        if message.attempt == 1:
            raise Retry("once more", delay=delay)


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("landing_ms", "levels"), [(300, [2, 1, 0]), (0, [3, 1])])
def test_a_retry_lands_early_through_fewer_levels_and_runs_at_its_due_time(
    rmq, registry_snapshot, landing_ms, levels
):
    """1 s retry: with a 300 ms landing the levels hold 700 ms (levels 2, 1, 0: 400 + 200 +
    100), the copy arrives ~300 ms early and its receiver still runs at or after the due
    time; with none, the levels hold all of it (3 and 1: 800 + 200)."""
    runs: list[dict] = []
    topic = Topic("test.landing")
    with _with(DELAY_LANDING_MS=landing_ms):
        _failing_once(topic, 1.0, runs)
        call_command("rmq_consume", setup_only=True, verbosity=0)
        topic.send({"n": 1})
        call_command("rmq_consume", "landing_probe", max_messages=2, verbosity=0)
    assert [r["attempt"] for r in runs] == [1, 2]
    second = runs[1]
    assert second["due"] is not None and second["ms"] >= second["due"] - 1, second
    crossed = sorted(
        (int(q.rsplit(".", 1)[1]) for q in second["deaths"] if ".delay." in q), reverse=True
    )
    assert crossed == levels
    assert rmq.depth(rmq.queue("landing_probe")) == 0
    assert ParkedMessage.objects.count() == 0


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_a_warm_stop_gives_a_held_copy_back_untouched_and_the_next_consumer_runs_it_once(
    rmq, registry_snapshot
):
    """A 3 s retry under a 3 s landing skips the levels: the consumer holds the copy. A warm
    stop while it is held returns it to its queue (nothing run, nothing lost); the next
    consumer holds it until due and runs it once."""
    runs: list[dict] = []
    topic = Topic("test.landing")
    with _with(DELAY_LANDING_MS=3000):
        _failing_once(topic, 3.0, runs)
        call_command("rmq_consume", setup_only=True, verbosity=0)
        topic.send({"n": 1})
        probe = default_registry.find("landing_probe", rmq.names.prefix)
        assert probe is not None
        consumer = Consumer([probe], consume_orphans=False)
        thread = threading.Thread(target=consumer.run)
        thread.start()
        try:
            assert wait_for(lambda: consumer._pool.held == 1, timeout=20)
        finally:
            consumer.request_stop()
            thread.join(30)
        assert not thread.is_alive()
        assert [r["attempt"] for r in runs] == [1]
        assert consumer.stats.retried == 1 and consumer.stats.handled == 0
        assert wait_for(lambda: rmq.depth(rmq.queue("landing_probe")) == 1, timeout=60)
        call_command("rmq_consume", "landing_probe", max_messages=1, verbosity=0)
    assert [r["attempt"] for r in runs] == [1, 2]
    assert runs[1]["ms"] >= runs[1]["due"] - 1
    assert rmq.depth(rmq.queue("landing_probe")) == 0
    assert ParkedMessage.objects.count() == 0


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("due", ["far", "text"])
def test_a_foreign_due_header_holds_a_message_no_longer_than_the_landing(
    rmq, registry_snapshot, due
):
    """A client that is not ours sets our due header an hour ahead (or to text): the message
    waits at most the landing plus one unit (here 0.3 + 0.1 s), then runs once."""
    runs: list[dict] = []
    topic = Topic("test.landing")
    with _with(DELAY_LANDING_MS=300):
        _failing_once(topic, 0, runs)
        call_command("rmq_consume", setup_only=True, verbosity=0)
        value = int(time.time() * 1000) + 3_600_000 if due == "far" else "soon"
        rmq.ch().basic_publish(
            rmq.names.work_exchange,
            "test.landing",
            b'{"n": 1}',
            pika.BasicProperties(
                content_type="application/json",
                message_id="foreign-1",
                headers={rmq.names.header("due"): value},
            ),
        )
        probe = default_registry.find("landing_probe", rmq.names.prefix)
        assert probe is not None
        consumer = Consumer([probe], consume_orphans=False, max_messages=2)
        thread = threading.Thread(target=consumer.run)
        thread.start()
        try:
            # Bounded: both runs come within a generous minute; an hour-long hold would not.
            assert wait_for(lambda: len(runs) == 2, timeout=60), runs
        finally:
            consumer.request_stop()
            thread.join(30)
        assert not thread.is_alive()
    assert [r["attempt"] for r in runs] == [1, 2]
    assert ParkedMessage.objects.count() == 0


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stop_while_held", [False, True], ids=["run", "warm-stop"])
def test_copies_held_past_one_window_widen_it_with_a_spare_consumer(
    rmq, registry_snapshot, stop_while_held
):
    """Prefetch 2 and SPARE_PREFETCH 8 (opted in), ten copies due 3 s after their first
    attempt, all in the landing: the window widens to 2 + 8 (a spare consumer on the same
    queue) so all ten are held at once, each
    runs once at or after its due time, and the spare leaves once nothing is held. A warm
    stop while they are held gives all ten back; the next consumer runs each once."""
    runs: list[dict] = []
    topic = Topic("test.landing")
    with _with(DELAY_LANDING_MS=3000, SPARE_PREFETCH=8):
        _failing_once(topic, 3.0, runs)
        call_command("rmq_consume", setup_only=True, verbosity=0)
        for n in range(10):
            topic.send({"n": n})
        probe = default_registry.find("landing_probe", rmq.names.prefix)
        assert probe is not None
        queue = rmq.queue("landing_probe")
        consumer = Consumer([probe], consume_orphans=False, prefetch=2)
        thread = threading.Thread(target=consumer.run)
        thread.start()
        try:
            # Without the spare, two held copies fill the window and the rest wait queued.
            assert wait_for(lambda: consumer._pool.held == 10, timeout=60), consumer._pool.held
            assert rmq.consumers(queue) == 2
            if not stop_while_held:
                assert wait_for(lambda: len(runs) == 20, timeout=60), len(runs)
                assert wait_for(lambda: rmq.consumers(queue) == 1, timeout=60)
                assert not consumer._spares.tags
        finally:
            consumer.request_stop()
            thread.join(30)
        assert not thread.is_alive()
        assert consumer.stats.retried == 10
        if stop_while_held:
            assert consumer.stats.handled == 0
            assert [r["attempt"] for r in runs] == [1] * 10
            assert wait_for(lambda: rmq.depth(queue) == 10, timeout=60)
            call_command("rmq_consume", "landing_probe", max_messages=10, verbosity=0)
        else:
            assert consumer.stats.handled == 10
    assert sorted(r["attempt"] for r in runs) == [1] * 10 + [2] * 10
    seconds = [r for r in runs if r["attempt"] == 2]
    assert all(r["ms"] >= r["due"] - 1 for r in seconds), seconds
    assert rmq.depth(queue) == 0
    assert ParkedMessage.objects.count() == 0
