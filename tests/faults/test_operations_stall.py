"""A rate-limited background requeue through a stall, measured where it matters: at the
receiver. The process stepping the operation is frozen (``SIGSTOP``) for a few seconds in
the middle of it, then woken (``SIGCONT``); the consumer (which steps nothing) keeps
handling. After the stall the operation must go on at its rate, not make up for the lost
seconds in a burst, and every message must arrive once.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections import Counter

import pytest

from django_rmq_retry.models import OperationState, ParkedMessage, ParkedStatus, RequeueOperation
from django_rmq_retry.parking import operations
from django_rmq_retry.parking.stepping import PACE_SECONDS
from tests import waiting
from tests.conftest import ROOT, Child, read_log, start_consumer, subprocess_env
from tests.test_operations import handled_ids, park_rows

pytestmark = [
    pytest.mark.faults,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

RATE = 40
N = 240
#: How long the stepping process stays frozen: the fault's size, not a wait for an event.
STALL_SECONDS = 3.0
#: What a 1 s window may hold beyond the rate: one paced step (the steps send in clumps of
#: ``RATE * PACE_SECONDS``, so a window can hold the clumps at both its ends), a quarter of
#: a second a late step may catch up, and one for rounding.
SLACK = math.ceil(RATE * PACE_SECONDS) + math.ceil(RATE * 0.25) + 1


def busiest_second(times: list[float]) -> tuple[int, float]:
    """The most arrivals in any window ``[t, t + 1 s)``, and where it starts. Windows that
    start at an arrival are enough: sliding one right to the next arrival loses nothing."""
    times = sorted(times)
    best, at, j = 0, 0.0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + 1.0:
            j += 1
        if j - i > best:
            best, at = j - i, start
    return best, at


def test_a_stall_of_the_stepping_process_never_turns_into_a_burst(rmq):
    """Catches: a step that, woken after the stall, sends the seconds it lost at once (the
    receiver then sees more than the rate in a second), a stall that loses or repeats a
    message, an operation that does not end after it."""
    park_rows(rmq, [{"id": i} for i in range(N)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", rate=float(RATE))
    env = {"DJANGO_SETTINGS_MODULE": "tests.faults.op_settings"}
    consumer = start_consumer(rmq.prefix, rmq.log, "alpha", "--no-relay", **env)
    step = Child(
        [sys.executable, str(ROOT / "manage.py"), "rmq_operations"],
        subprocess_env(rmq.prefix, rmq.log, **env),
        rmq.log.with_name("stepper.out"),
    )
    try:
        waiting.until(
            "a third of the copies sent",
            lambda: RequeueOperation.objects.get(pk=op.pk).sent >= N // 3,
            child=step,
        )
        step.send_signal(signal.SIGSTOP)
        frozen_at = time.time()
        sent = RequeueOperation.objects.get(pk=op.pk).sent
        waiting.until(
            "the receiver handled what was sent before the stall",
            lambda: sum(handled_ids(rmq).values()) >= sent,
            child=consumer,
        )
        time.sleep(max(0.0, STALL_SECONDS - (time.time() - frozen_at)))  # the stall itself
        woken_at = time.time()
        step.send_signal(signal.SIGCONT)
        waiting.until(
            "the operation ended",
            lambda: RequeueOperation.objects.get(pk=op.pk).state != OperationState.RUNNING,
            child=step,
            timeout=240,
        )
        waiting.until(f"{N} handled", lambda: sum(handled_ids(rmq).values()) >= N, child=consumer)
    finally:
        step.send_signal(signal.SIGCONT)
        for child in (step, consumer):
            child.send_signal(signal.SIGTERM)
        for child in (step, consumer):
            child.communicate(timeout=60)
    op.refresh_from_db()
    assert (op.state, op.sent, op.handled, op.unknown) == (OperationState.DONE, N, N, 0), (
        op.state_reason
    )
    assert handled_ids(rmq) == Counter(range(N))  # every message once
    assert not ParkedMessage.objects.filter(status=ParkedStatus.PARKED).exists()
    first: dict[int, float] = {}  # each message's first arrival at the receiver
    for e in read_log(rmq.log):
        if e["event"] == "start":
            first[e["id"]] = min(e["t"], first.get(e["id"], e["t"]))
    assert sorted(first) == list(range(N))
    arrivals = list(first.values())
    after = [t for t in arrivals if t >= woken_at]
    assert after, "nothing arrived after the stall: it was not mid-operation"
    most, at = busiest_second(arrivals)
    print(
        f"busiest second: {most} arrivals from {at - woken_at:+.2f} s after the wake-up "
        f"(rate {RATE}/s, bound {RATE + SLACK}); {len(after)} arrived after the stall"
    )
    assert most <= RATE + SLACK, (most, at - woken_at)
