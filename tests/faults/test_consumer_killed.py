"""Scenario 1 (and 9): consumers SIGKILLed at random moments while messages flow.

Three receivers (alpha and beta on ``test.work``, gamma on ``test.other``), about 30 % of the
messages failing: some transiently (``fail`` 1 or 2), some always. After every kill a consumer
is restarted; at the end every (receiver, id) is handled or parked after exactly its policy's
max attempts, and nothing is lost.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
from django.core.management import call_command

from tests.conftest import wait_for
from tests.faults.conftest import Tally, kill, record, settle, spawn, stop
from tests.testapp.events import other, work

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

MAX_ATTEMPTS = {"alpha": 3, "beta": 3, "gamma": 10}


def make_workload(n: int, seed: int) -> tuple[list[tuple[object, dict]], dict]:
    rng = random.Random(seed)
    messages = []
    expected: dict = {}
    for i in range(n):
        r = rng.random()
        body: dict = {"id": i}
        if r < 0.10:
            body["fail"] = 1
        elif r < 0.20:
            body["fail"] = 2
        elif r < 0.30:
            body["fail"] = "always"
        topic = other if i % 3 == 2 else work
        receivers = ("gamma",) if topic is other else ("alpha", "beta")
        for name in receivers:
            expected[(name, i)] = "parked" if body.get("fail") == "always" else "done"
        messages.append((topic, body))
    return messages, expected


def publish_all(messages: list[tuple[object, dict]], errors: list[BaseException]) -> None:
    try:
        for topic, body in messages:
            topic.send(body)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def run_with_kills(rmq, procs, *, consumers: int, n: int, kills: int, seed: int, label: str):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    messages, expected = make_workload(n, seed)
    rng = random.Random(seed + 1)
    errors: list[BaseException] = []
    publisher = threading.Thread(target=publish_all, args=(messages, errors))
    t0 = time.monotonic()
    publisher.start()

    def launch():
        p = spawn(rmq, "--prefetch", "20", "--threads", "2")
        procs.append(p)
        return p

    def log_size() -> int:
        return rmq.log.stat().st_size if rmq.log.exists() else 0

    running = [launch() for _ in range(consumers)]
    done_kills = 0
    while done_kills < kills:
        # Kill only once the freshest consumer is at work (the log grows), at a random moment.
        size = log_size()
        wait_for(lambda s=size: log_size() > s, timeout=15)
        time.sleep(rng.uniform(0.05, 1.5))
        i = rng.randrange(len(running))
        kill(running[i])
        done_kills += 1
        running[i] = launch()
    publisher.join(timeout=300)
    assert not errors, errors
    tally = Tally(expected)
    settled = settle(rmq, tally, timeout=float(os.environ.get("FAULTS_SETTLE", 180)))
    for p in running:
        stop(p)
    elapsed = time.monotonic() - t0

    # A message running at DELIVERY_LIMIT of the kills is parked as delivery_limit, done or
    # not: what the product promises (tests/faults/conftest.py), accounted for, never lost.
    by_deaths = tally.parked_by_deaths(kills)
    wrong_attempts = [
        f"{k}: {row.reason} after {row.attempts} attempts"
        for k, row in tally.parked.items()
        if k in expected
        and expected[k] == "parked"
        and k not in by_deaths
        and (row.reason != "exhausted" or row.attempts != MAX_ATTEMPTS[k[0]])
    ]
    delivery_limit = sum(1 for row in tally.parked.values() if row.reason == "delivery_limit")
    record(
        label,
        published=len(messages),
        handled=tally.handled_ok,
        parked=tally.parked_count,
        duplicates=tally.duplicates,
        lost=len(tally.lost),
        notes=f"{kills} SIGKILLs, {consumers} consumer(s), {len(expected)} pairs, "
        f"{delivery_limit} delivery_limit parks, {elapsed:.0f}s",
    )
    assert settled, f"not settled; lost so far: {tally.lost[:20]}"
    assert tally.lost == []
    assert tally.wrong_outcome(deaths=kills) == []
    assert wrong_attempts == []


def test_consumer_sigkilled_repeatedly(rmq, procs):
    run_with_kills(
        rmq,
        procs,
        consumers=1,
        n=int(os.environ.get("FAULTS_KILL_MESSAGES", 5000)),
        kills=int(os.environ.get("FAULTS_KILLS", 20)),
        seed=1,
        label="1 consumer SIGKILLed",
    )


def test_three_consumers_killed_and_restarted(rmq, procs):
    run_with_kills(
        rmq,
        procs,
        consumers=3,
        n=int(os.environ.get("FAULTS_MULTI_MESSAGES", 2000)),
        kills=int(os.environ.get("FAULTS_MULTI_KILLS", 12)),
        seed=9,
        label="9 three consumers, kills",
    )
