"""Publish → rmq_consume → receiver → ack, against the real broker."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from django.core.management import call_command

from tests.conftest import read_log, start_consumer, wait_for
from tests.testapp.events import other, work
from tests.waiting import output_has

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def consume(*args: str, **opts) -> None:
    call_command("rmq_consume", *args, verbosity=0, **opts)


def test_every_message_reaches_every_receiver_once(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(50):
        work.send({"id": i})
    consume("alpha", "beta", max_messages=100, max_idle_time=5)
    done = Counter((e["receiver"], e["id"]) for e in read_log(rmq.log) if e["event"] == "done")
    assert len(done) == 100
    assert set(done.values()) == {1}
    assert rmq.depth(rmq.queue("alpha")) == 0
    assert rmq.depth(rmq.queue("beta")) == 0


def test_consumer_in_a_subprocess_counts_every_message(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(30):
        other.send({"id": i})
    proc = start_consumer(
        rmq.prefix, rmq.log, "gamma", "--max-messages", "30", "--max-idle-time", "10"
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "30 handled" in out
    ids = sorted(e["id"] for e in read_log(rmq.log) if e["event"] == "done")
    assert ids == list(range(30))


def test_sigterm_loses_nothing(rmq):
    """Warm shutdown mid-run: handled + still queued == published, nothing acked unhandled."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    total = 40
    for i in range(total):
        other.send({"id": i, "sleep": 0.05})
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "--prefetch", "10")
    assert wait_for(lambda: len([e for e in read_log(rmq.log) if e["event"] == "done"]) >= 5, 30)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    done = {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}
    assert 0 < len(done) < total
    # Every started receiver finished (warm shutdown), the rest are back in the queue.
    started = {e["id"] for e in read_log(rmq.log) if e["event"] == "start"}
    assert started == done
    # The broker puts what the child never acked back once its connection is gone.
    assert wait_for(lambda: rmq.depth(rmq.queue("gamma")) == total - len(done), 30)


def test_second_signal_exits_cold_and_loses_nothing(rmq):
    """SIGTERM twice: the process exits at once; the running message returns to the queue."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": "slow", "sleep": 30})
    proc = start_consumer(rmq.prefix, rmq.log, "gamma")
    assert wait_for(lambda: any(e["event"] == "start" for e in read_log(rmq.log)), 30)
    proc.send_signal(signal.SIGTERM)
    # The first one is handled (a warm stop begins) before the second is sent: two sent
    # at once may reach the handler as one.
    output_has(proc, "SIGTERM: stopping")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "cold exit" in out
    assert wait_for(lambda: rmq.depth(rmq.queue("gamma")) == 1, 60)


def test_threads_run_receivers_concurrently(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(8):
        other.send({"id": i, "sleep": 0.5})
    consume("gamma", threads=8, prefetch=8, max_messages=8, max_idle_time=5)
    log = read_log(rmq.log)
    spans = {e["id"]: [e["t"], None] for e in log if e["event"] == "start"}
    for e in log:
        if e["event"] == "done":
            spans[e["id"]][1] = e["t"]
    assert len(spans) == 8 and all(end is not None for _, end in spans.values())
    # receivers overlapped in time: at the moment the last one started, others were running
    last_start = max(start for start, _ in spans.values())
    running = sum(1 for start, end in spans.values() if start <= last_start < end)
    assert running > 1
