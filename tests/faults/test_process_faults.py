"""Scenarios 4, 5 and 6: a receiver that kills the process, SIGTERM under load, and a
receiver slower than twice the heartbeat. All against a real consumer subprocess."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry.models import DeliveryStart, ParkedMessage
from django_rmq_retry.publishing.per_thread import reset_publisher
from tests.conftest import read_log, wait_for
from tests.faults.conftest import output, record, spawn, stop, undeclare
from tests.testapp.events import other

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def events(rmq, kind):
    return [e for e in read_log(rmq.log) if e["event"] == kind]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_poison_message_that_exits_the_process_is_parked_after_the_delivery_limit(
    rmq, procs, queue_type
):
    """Scenario 4: ``os._exit`` on every attempt; restarts are bounded by DELIVERY_LIMIT.

    Classic queues count with DeliveryStart rows, quorum queues with x-delivery-count.
    """
    undeclare(rmq)
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "QUEUE_TYPE": queue_type}):
        reset_publisher()
        try:
            _poison(rmq, procs, queue_type)
        finally:
            reset_publisher()


def _poison(rmq, procs, queue_type):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    limit = 5
    other.send({"id": "poison", "exit": 99})
    for i in range(20):
        other.send({"id": i})
    deaths = 0
    for _round in range(3 * limit):
        proc = spawn(
            rmq,
            "gamma",
            "--threads",
            "1",
            RMQ_TEST_ALLOW_EXIT="1",
            RMQ_DELIVERY_LIMIT=str(limit),
            RMQ_QUEUE_TYPE=queue_type,
        )
        procs.append(proc)
        finished = wait_for(
            lambda p=proc: (
                p.poll() is not None
                or ParkedMessage.objects.filter(
                    message_id__isnull=False, reason="delivery_limit"
                ).exists()
            ),
            timeout=60,
        )
        assert finished, output(proc)[-3000:]
        if proc.poll() is None:
            break
        assert proc.returncode == 42, stop(proc)
        deaths += 1
    assert wait_for(lambda: len({e["id"] for e in events(rmq, "done")}) >= 20, 60), (
        deaths,
        [(e["event"], e["id"], e["attempt"], e["redelivered"]) for e in read_log(rmq.log)][:60],
        list(ParkedMessage.objects.values_list("reason", "reason_detail")),
    )
    out = stop(proc)
    row = ParkedMessage.objects.get(reason="delivery_limit")
    poison_starts = sum(1 for e in events(rmq, "start") if e["id"] == "poison")
    done = Counter(e["id"] for e in events(rmq, "done"))
    record(
        f"4 poison os._exit ({queue_type})",
        published=21,
        handled=len(done),
        parked=ParkedMessage.objects.count(),
        duplicates=sum(n - 1 for n in done.values()),
        lost=21 - len(done) - ParkedMessage.objects.count(),
        notes=f"{deaths} process deaths, poison ran {poison_starts}x, limit {limit}",
    )
    assert row.receiver.endswith("gamma")
    assert "limit" in row.reason_detail, row.reason_detail
    # First delivery + (limit - 1) counted redeliveries run the receiver; the next one parks.
    assert poison_starts == limit, poison_starts
    assert deaths == limit, deaths
    assert set(done) == set(range(20))
    assert not DeliveryStart.objects.exists()
    assert rmq.depth(rmq.queue("gamma")) == 0, out


@pytest.mark.parametrize(
    "sleep,timeout,total", [(1.0, 10, 40), (6.0, 1, 8)], ids=["finish", "overrun"]
)
def test_sigterm_with_a_full_prefetch_window(rmq, procs, sleep, timeout, total):
    """Scenario 5: in-flight receivers finish and are acked, the rest go back, exit on time.

    "On time" is proved by order and count, not by the clock (a loaded host stretches any
    window): with receivers shorter than the shutdown timeout, every started one finished
    and none was reported still running; with longer ones, the process was gone before
    they could finish (they never logged "done"), and it said how many it left running."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(total):
        other.send({"id": i, "sleep": sleep})
    proc = spawn(
        rmq,
        "gamma",
        "--prefetch",
        "10",
        "--threads",
        "4",
        RMQ_SHUTDOWN_TIMEOUT=str(timeout),
    )
    procs.append(proc)
    assert wait_for(lambda: len(events(rmq, "start")) >= 4, 60)
    t0 = time.monotonic()
    out = stop(proc, timeout=timeout + 30)
    took = time.monotonic() - t0
    started = {e["id"] for e in events(rmq, "start")}
    done_at_stop = {e["id"] for e in events(rmq, "done")}
    # What it did not ack is back once the broker has seen its connection close.
    want_back = total - len(done_at_stop)
    depth = [-1]

    def requeued() -> bool:
        depth[0] = rmq.depth(rmq.queue("gamma"))
        return depth[0] == want_back

    wait_for(requeued, 60)
    back_in_queue = depth[0]
    # Drain what is left with a fresh consumer and count everything.
    proc2 = spawn(rmq, "gamma", "--prefetch", "10", "--threads", "4")
    procs.append(proc2)
    assert wait_for(lambda: len({e["id"] for e in events(rmq, "done")}) >= total, 120)
    stop(proc2)
    done = Counter(e["id"] for e in events(rmq, "done"))
    record(
        f"5 SIGTERM, receivers {sleep:g}s, timeout {timeout}s",
        published=total,
        handled=len(done),
        parked=ParkedMessage.objects.count(),
        duplicates=sum(n - 1 for n in done.values()),
        lost=total - len(done),
        notes=f"exit after {took:.1f}s, {len(done_at_stop)} acked at stop, "
        f"{back_in_queue} back in queue, {len(started - done_at_stop)} unfinished",
    )
    # A hang fails here: stop() kills a child still running timeout + 30 s after its
    # SIGTERM (exit -9). The order and counts below say whether it exited on time.
    assert proc.returncode == 0, out
    assert set(done) == set(range(total))
    assert back_in_queue == want_back
    left = re.search(r"(\d+) receiver\(s\) still running", out)
    if sleep < timeout:
        assert started == done_at_stop, "a started receiver did not finish"
        assert left is None, out
        assert set(done.values()) == {1}
    else:
        unfinished = started - done_at_stop
        assert unfinished, f"the consumer waited for its {sleep:g} s receivers: {out}"
        assert left is not None and int(left.group(1)) == len(unfinished), out


def test_receiver_slower_than_two_heartbeats_keeps_its_connection(rmq, procs):
    """Scenario 6: heartbeat 2 s, receiver sleeps 7 s: no disconnect, handled and acked once."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": "slow", "sleep": 7})
    other.send({"id": "after"})
    proc = spawn(rmq, "gamma", "--threads", "1", RMQ_HEARTBEAT="2")
    procs.append(proc)
    assert wait_for(lambda: len(events(rmq, "done")) >= 2, 60)
    time.sleep(5)  # two more heartbeat intervals: a dead connection would redeliver by now
    out = stop(proc)
    starts = Counter(e["id"] for e in events(rmq, "start"))
    done = Counter(e["id"] for e in events(rmq, "done"))
    record(
        "6 slow receiver (7s, heartbeat 2s)",
        published=2,
        handled=len(done),
        parked=ParkedMessage.objects.count(),
        duplicates=sum(n - 1 for n in done.values()),
        lost=2 - len(done),
        notes=f"starts {dict(starts)}",
    )
    assert starts == {"slow": 1, "after": 1}, out
    assert done == {"slow": 1, "after": 1}
    assert "connection to RabbitMQ lost" not in out, out
    assert "0 reconnect(s)" in out, out
    assert rmq.depth(rmq.queue("gamma")) == 0
