"""Scenario 1 with ``async def`` receivers, and with ``django.tasks`` tasks: consumers
SIGKILLed at random moments while messages flow; restarted after every kill. At the end every
message is handled or parked after exactly its policy's attempts, every task's result is final
(SUCCESSFUL, or FAILED with its parked row), every run beyond a task's own attempts was on a
killed consumer, and nothing is lost.
"""

from __future__ import annotations

import importlib
import os
import random
import socket
import time

import pytest
from django.core.management import call_command

from django_rmq_retry.registry import default_registry
from django_rmq_retry.registry.task_api import task_api_module
from tests.conftest import wait_for
from tests.faults.conftest import Tally, kill, queues_empty, record, settle, spawn, stop

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

#: The most runs one SIGKILL can add to a task's own attempts (see the tasks scenario).
DUPLICATES_PER_KILL = 2


@pytest.fixture
def aio(registry_snapshot):
    from tests.testapp import async_consumers

    default_registry.unregister(async_consumers.delta)
    return importlib.reload(async_consumers)


def kill_and_restart(rmq, procs, launch, *, kills: int, seed: int) -> list:
    """``kills`` SIGKILLs of the one consumer, each once it is at work, at a random moment."""
    rng = random.Random(seed)
    running = launch()
    procs.append(running)

    def log_size() -> int:
        return rmq.log.stat().st_size if rmq.log.exists() else 0

    for _ in range(kills):
        size = log_size()
        wait_for(lambda s=size: log_size() > s, timeout=15)
        time.sleep(rng.uniform(0.05, 1.0))
        kill(running)
        running = launch()
        procs.append(running)
    return [running]


def test_async_receiver_consumer_sigkilled_repeatedly(rmq, procs, aio):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    n = int(os.environ.get("FAULTS_ASYNC_MESSAGES", 1500))
    rng = random.Random(34)
    expected = {}
    for i in range(n):
        r = rng.random()
        body: dict = {"id": i, "sleep": 0.02}
        if r < 0.10:
            body["fail"] = 1
        elif r < 0.20:
            body["fail"] = "always"
        expected[("delta", i)] = "parked" if body.get("fail") == "always" else "done"
        aio.aio_topic.send(body)
    t0 = time.monotonic()
    kills = int(os.environ.get("FAULTS_ASYNC_KILLS", 8))
    running = kill_and_restart(
        rmq,
        procs,
        lambda: spawn(rmq, "delta", "--prefetch", "50", RMQ_TEST_ASYNC="1"),
        kills=kills,
        seed=35,
    )
    tally = Tally(expected)
    settled = settle(rmq, tally, timeout=float(os.environ.get("FAULTS_SETTLE", 180)))
    for p in running:
        stop(p)
    # Up to 50 receivers run at once (the prefetch window): a message can be running at
    # DELIVERY_LIMIT of the kills and be parked as delivery_limit, done or not (a CI run
    # parked ('delta', 295) so): what the product promises, accounted for, never lost.
    by_deaths = tally.parked_by_deaths(kills)
    wrong_attempts = [
        f"{k}: {row.reason} after {row.attempts} attempts"
        for k, row in tally.parked.items()
        if expected.get(k) == "parked"
        and k not in by_deaths
        and (row.reason != "exhausted" or row.attempts != 3)
    ]
    record(
        "1 with async def receivers, SIGKILLed",
        published=n,
        handled=tally.handled_ok,
        parked=tally.parked_count,
        duplicates=tally.duplicates,
        lost=len(tally.lost),
        notes=f"async def receiver, concurrency 100, {kills} SIGKILLs, "
        f"{len(by_deaths)} parked by the delivery limit, {time.monotonic() - t0:.0f}s",
    )
    assert settled, f"not settled; lost so far: {tally.lost[:20]}"
    assert tally.lost == []
    assert tally.wrong_outcome(deaths=kills) == []
    assert wrong_attempts == []


@pytest.mark.skipif(
    task_api_module() is None,
    reason="Django < 6.0 without the django-tasks backport (pip install django-tasks)",
)
def test_tasks_consumer_sigkilled_repeatedly(rmq, procs):
    from django_rmq_retry.conf import app_settings
    from django_rmq_retry.core.budget import UNSEEN_CAUSE
    from django_rmq_retry.models import ParkedMessage, TaskResultRecord
    from tests.tasksproject import tasks as t

    call_command("rmq_consume", setup_only=True, verbosity=0)
    n = int(os.environ.get("FAULTS_TASK_MESSAGES", 600))
    want: dict[str, str] = {}  # result id -> "SUCCESSFUL" | "parked"
    runs: dict[str, int] = {}  # result id -> the attempts it takes when nothing is killed
    for i in range(n):
        kind = i % 4
        if kind == 0:
            rid, want_runs = t.add.enqueue(i, i).id, 1
        elif kind == 1:
            rid, want_runs = t.flaky_task.enqueue(succeed_on=2).id, 2
        elif kind == 2:
            rid, want_runs = t.async_add.enqueue(i, 1).id, 1
        else:
            rid, want_runs = t.always_fails.enqueue("transient").id, 2
        want[rid] = "parked" if kind == 3 else "SUCCESSFUL"
        runs[rid] = want_runs
    names = [
        f"tasks.default.tests.tasksproject.tasks.{f}"
        for f in ("add", "flaky_task", "async_add", "always_fails")
    ]
    rmq.log.touch()

    def launch():
        # Tasks write no handling log: the consumer's own output grows instead.
        return spawn(rmq, *names, "--prefetch", "20", "--threads", "2")

    kills = int(os.environ.get("FAULTS_TASK_KILLS", 6))
    rng = random.Random(36)
    running = launch()
    procs.append(running)
    killed: set[str] = set()  # TaskResult.worker_ids of the killed consumers (host:pid)
    for _ in range(kills):
        wait_for(lambda: TaskResultRecord.objects.exclude(status="READY").exists(), 30)
        time.sleep(rng.uniform(0.2, 1.5))
        killed.add(f"{socket.gethostname()}:{running.pid}")
        kill(running)
        running = launch()
        procs.append(running)

    def parked_by_deaths() -> set[str]:
        """Tasks running at DELIVERY_LIMIT of the kills: parked as delivery_limit, as the
        product promises (tests/faults/conftest.py), accounted for, never lost."""
        if kills < int(app_settings.DELIVERY_LIMIT):
            return set()
        rows = ParkedMessage.objects.filter(
            reason="delivery_limit", reason_detail__contains=UNSEEN_CAUSE
        )
        return set(rows.values_list("message_id", flat=True))

    def missing() -> list[str]:
        finished = dict(
            TaskResultRecord.objects.filter(status="SUCCESSFUL").values_list("id", "status")
        )
        parked = set(ParkedMessage.objects.values_list("message_id", flat=True))
        by_deaths = parked_by_deaths()
        return [
            rid
            for rid, outcome in want.items()
            if (outcome == "SUCCESSFUL" and rid not in finished and rid not in by_deaths)
            or (outcome == "parked" and rid not in parked)
        ]

    deadline = time.monotonic() + float(os.environ.get("FAULTS_SETTLE", 180))
    while missing() and time.monotonic() < deadline:
        time.sleep(0.5)
    settled = not missing() and queues_empty(rmq)
    stop(running)
    lost = missing()
    # Every task terminal: SUCCESSFUL, or FAILED once parked; none left READY or RUNNING.
    rows = {r.id: r for r in TaskResultRecord.objects.filter(id__in=list(want))}
    not_final = sorted(
        f"{rid}: {rows[rid].status if rid in rows else 'no row'}"
        for rid in want
        if rid not in rows or rows[rid].status not in ("SUCCESSFUL", "FAILED")
    )
    # Every run beyond a task's own attempts explained by a kill: each attempt appends its
    # worker to worker_ids before the task runs, so a run a kill cut short is a killed id.
    # One kill explains at most two: the run it cut short, and, when it came between the
    # broker's confirm of a failed attempt's retry copy and the ack of the delivery (at
    # least once: never ack before what replaces it is confirmed), that delivery's run again
    # on the next consumer, whose failure sends a second copy: the next attempt runs twice.
    extra = {rid: len(r.worker_ids) - runs[rid] for rid, r in rows.items() if r.worker_ids}
    unexplained = sorted(
        f"{rid}: {rows[rid].worker_ids} for {runs[rid]} attempt(s)"
        for rid, more in extra.items()
        if more > DUPLICATES_PER_KILL * sum(1 for w in rows[rid].worker_ids if w in killed)
    )
    record(
        "1 with django.tasks tasks, SIGKILLed",
        published=n,
        handled=sum(1 for o in want.values() if o == "SUCCESSFUL") - len(lost),
        parked=ParkedMessage.objects.count(),
        duplicates=sum(max(0, more) for more in extra.values()),
        lost=len(lost),
        notes=f"{kills} SIGKILLs; sync, flaky, async and failing tasks; "
        f"{len(parked_by_deaths())} parked by the delivery limit; duplicates: runs beyond "
        f"a task's attempts, {len(unexplained)} not on a killed consumer",
    )
    assert lost == []
    assert settled
    assert not_final == []
    assert unexplained == []
    wrong = ParkedMessage.objects.exclude(
        message_id__in=[r for r, o in want.items() if o == "parked"]
    ).exclude(message_id__in=parked_by_deaths())
    assert list(wrong.values_list("receiver", "reason")) == []
