"""Broker events that disturb everyone (issue 12): a memory alarm and a short
``consumer_timeout``. Both change the shared broker's global state: run this file under the
exclusive lock (``flock -x /tmp/rmq310.lock``); each test restores what it changed, whatever
happens."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command

from django_rmq_retry.models import DeliveryStart, ParkedMessage
from tests.conftest import rabbitmqctl_cmd, read_log, wait_for
from tests.faults.conftest import Tally, record, settle, spawn, stop
from tests.testapp.events import other

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

LIMIT = 5  # tests/settings.py: DELIVERY_LIMIT


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        rabbitmqctl_cmd("-q", *args), check=True, capture_output=True, text=True, timeout=60
    ).stdout


def queue_counts(queue: str) -> tuple[int, int]:
    """(ready, unacked) of ``queue``, from the broker's own counters."""
    out = rabbitmqctl("list_queues", "name", "messages_ready", "messages_unacknowledged")
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0] == queue:
            return int(parts[1]), int(parts[2])
    raise AssertionError(f"no queue {queue}")


def runs(rmq, ident, event="start") -> int:
    return sum(1 for e in read_log(rmq.log) if e["event"] == event and e["id"] == ident)


def attempts(rmq, ident, attempt) -> int:
    return sum(
        1
        for e in read_log(rmq.log)
        if e["event"] == "start" and e["id"] == ident and e["attempt"] == attempt
    )


@contextlib.contextmanager
def memory_alarm() -> Iterator[None]:
    try:
        rabbitmqctl("set_vm_memory_high_watermark", "0.0000001")
        assert wait_for(lambda: "memory" in rabbitmqctl("eval", "rabbit_alarm:get_alarms()."), 30)
        yield
    finally:
        rabbitmqctl("set_vm_memory_high_watermark", "0.4")
        assert wait_for(
            lambda: "memory" not in rabbitmqctl("eval", "rabbit_alarm:get_alarms()."), 30
        )


def _get_env(key: str) -> str | None:
    out = rabbitmqctl("eval", f"application:get_env(rabbit, {key}).").strip()
    match = re.search(r"\{ok,(\d+)\}", out)
    return match.group(1) if match else None


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        rabbitmqctl("eval", f"application:unset_env(rabbit, {key}).")
    else:
        rabbitmqctl("eval", f"application:set_env(rabbit, {key}, {value}).")


@contextlib.contextmanager
def consumer_timeout(ms: int) -> Iterator[None]:
    """The broker-wide ``consumer_timeout`` (3.10 has no per-queue argument), checked on
    every channel tick (``channel_tick_interval``, 60 s by default: shortened too); channels
    opened meanwhile get both."""
    saved = {key: _get_env(key) for key in ("consumer_timeout", "channel_tick_interval")}
    try:
        rabbitmqctl("eval", f"application:set_env(rabbit, consumer_timeout, {ms}).")
        rabbitmqctl("eval", "application:set_env(rabbit, channel_tick_interval, 500).")
        yield
    finally:
        for key, value in saved.items():
            _restore_env(key, value)


def test_acks_flow_during_a_memory_alarm_while_retry_copies_wait(rmq, procs):
    """Retry copies used to share the consumer's connection: the first copy published during
    an alarm got the connection blocked, and the broker stopped reading its acks too."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("gamma")
    proc = spawn(rmq, "gamma", "--threads", "10")
    procs.append(proc)
    other.send({"id": "warm-up"})
    assert wait_for(lambda: runs(rmq, "warm-up", "done") == 1, 30)
    failing, passing = range(5), range(5, 10)
    for i in failing:
        other.send({"id": i, "sleep": 6, "fail": 1})  # its copy is published first
    for i in passing:
        other.send({"id": i, "sleep": 8})
    assert wait_for(lambda: all(runs(rmq, i) == 1 for i in range(10)), 30)
    with memory_alarm():
        acked = wait_for(lambda: all(runs(rmq, i, "done") == 1 for i in passing), 20)
        flowed = wait_for(lambda: queue_counts(queue) == (0, len(failing)), 10, 0.5)
        during = queue_counts(queue)
        copies_ran = sum(attempts(rmq, i, 2) for i in failing)
    expected = {("gamma", i): "done" for i in [*range(10), "warm-up"]}
    tally = Tally(expected)
    ok = settle(rmq, tally, 60)
    out = stop(proc)
    record(
        "memory alarm: acks vs retry copies",
        published=len(expected),
        handled=tally.handled_ok,
        parked=tally.parked_count,
        duplicates=tally.duplicates,
        lost=len(tally.lost),
        notes=f"(ready, unacked) during the alarm {during}; copies delivered during it {copies_ran}",
    )
    assert acked
    assert flowed, f"acks held up by the alarm: (ready, unacked) = {during}"
    assert copies_ran == 0  # the copies waited for the alarm to clear
    assert ok and not tally.lost and not tally.parked, tally.wrong_outcome()
    assert "RabbitMQ blocked the retry-copies connection" in out
    assert "blocked the consumer connection" not in out


def test_consumer_timeout_closing_the_channel_under_a_slow_receiver_is_bounded(rmq, procs):
    """The broker closes the channel (406, acknowledgement timed out) under a receiver slower
    than ``consumer_timeout``: the consumer notices, reconnects, and the redeliveries count
    against the give-back budget, so the message is parked after ``LIMIT`` runs instead of
    looping; the messages around it are handled."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with consumer_timeout(1000):
        proc = spawn(rmq, "gamma", "--threads", "2")
        procs.append(proc)
        other.send({"id": "slow", "sleep": 4})
        for i in range(5):
            other.send({"id": i})
        parked = wait_for(lambda: ParkedMessage.objects.exists(), 120, 1)
        time.sleep(3)  # a window, not a wait: a loop the limit did not end would run it again
        n = runs(rmq, "slow")
    expected = {("gamma", i): "done" for i in range(5)}
    tally = Tally(expected)
    ok = settle(rmq, tally, 30)
    out = stop(proc)
    row = ParkedMessage.objects.first()
    record(
        "consumer_timeout 1 s, receiver 4 s",
        published=6,
        handled=tally.handled_ok + (1 if runs(rmq, "slow", "done") else 0),
        parked=1 if row else 0,
        duplicates=tally.duplicates + max(0, runs(rmq, "slow", "done") - 1),
        lost=len(tally.lost) + (0 if row else 1),
        notes=f"slow receiver runs {n}, reconnects {out.count('reconnecting in')}",
    )
    assert parked, f"never parked after {n} runs\n{out[-3000:]}"
    assert n == LIMIT, f"{n} runs (limit {LIMIT})"
    assert row is not None and row.reason == "delivery_limit"
    assert "timed out" in row.reason_detail, row.reason_detail
    assert ok and not tally.lost
    assert not DeliveryStart.objects.exists()
