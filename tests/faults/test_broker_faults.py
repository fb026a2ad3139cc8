"""Scenarios 2 and 8: the broker goes away under a running consumer, publisher and bulk
requeue. Stops the shared RabbitMQ application for a few seconds (``rabbitmqctl stop_app``)
and always starts it again, whatever happens in the test."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from django_rmq_retry import parking
from django_rmq_retry.conf import app_settings, current_plan
from django_rmq_retry.core.errors import PublishError
from django_rmq_retry.models import ParkedMessage, ParkedStatus
from django_rmq_retry.registry import default_registry
from tests.conftest import BROKER_URL, _broker_reachable, rabbitmqctl_cmd, wait_for
from tests.faults.conftest import Tally, depths, queues_empty, record, settle, spawn, stop
from tests.test_broker_edges import close_connections
from tests.testapp.events import other, work

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def rabbitmqctl(*args: str) -> None:
    subprocess.run(rabbitmqctl_cmd(*args), check=True, capture_output=True, timeout=120)


def start_broker() -> None:
    rabbitmqctl("start_app")
    assert wait_for(lambda: _broker_reachable() is None, 60, 0.5), "RabbitMQ did not come back"


@contextlib.contextmanager
def broker_stopped() -> Iterator[None]:
    try:
        rabbitmqctl("stop_app")
        yield
    finally:
        start_broker()


def delay_depth(rmq) -> int:
    plan = current_plan(default_registry.all(), rmq.names)
    total = 0
    for q in plan.queues:
        if ".delay." in q.name:
            with contextlib.suppress(Exception):
                total += rmq.depth(q.name)
    return total


def test_broker_restart_mid_run(rmq, procs):
    """Scenario 2: consumer and publisher reconnect by themselves; messages waiting in delay
    levels and in queues survive the restart (durable topology, persistent messages)."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    expected: dict = {}
    hops: set = set()  # pairs whose message passes through delay levels (dead-letter hops)

    def body_for(i: int) -> tuple[object, dict]:
        body: dict = {"id": i}
        if i % 3 == 0:
            body.update(fail=1, retry_delay=4)  # waits 4 s in the delay levels
        elif i % 10 == 1:
            body["fail"] = "always"
        topic = other if i % 2 else work
        for name in ("gamma",) if topic is other else ("alpha", "beta"):
            expected[(name, i)] = "parked" if body.get("fail") == "always" else "done"
            if "fail" in body:
                hops.add((name, i))
        return topic, body

    proc = spawn(rmq, "--threads", "2", PYTHONFAULTHANDLER="1")
    procs.append(proc)
    first = 300
    for i in range(first):
        topic, body = body_for(i)
        topic.send(body)
    # Every delayed message has failed once and its retry copy waits in a delay level.
    assert wait_for(lambda: delay_depth(rmq) >= 50, 60), delay_depth(rmq)
    waiting = delay_depth(rmq)

    refused = 0
    published = first
    errors: list[BaseException] = []

    def keep_publishing() -> None:
        nonlocal refused, published
        try:
            for i in range(first, first + 200):
                topic, body = body_for(i)
                while True:
                    try:
                        topic.send(body)
                        published += 1
                        break
                    except PublishError:
                        refused += 1  # the caller is told: not stored, try again
                        time.sleep(0.5)
                time.sleep(0.03)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=keep_publishing)
    with broker_stopped():
        t.start()
        time.sleep(6)  # longer than the 4 s delay: TTLs expire while the broker is down
    t.join(120)
    assert not errors, errors
    tally = Tally(expected)
    settled = settle(rmq, tally, timeout=60)
    classic = settings.RMQ_RETRY.get("QUEUE_TYPE", "classic") == "classic"
    in_hop = []  # lost where RabbitMQ promises at-most-once (classic dead-letter hop)
    if (
        not settled
        and classic
        and set(tally.lost) <= hops
        and wait_for(lambda: queues_empty(rmq), 10)
    ):
        in_hop = list(tally.lost)
    alive = proc.poll() is None
    lost_then = list(tally.lost)  # after 60 s: the count table's "lost"
    late = ""
    if not settled and alive and not in_hop:
        # Not settled in 60 s: what the broker holds now, and whether the missing pairs are
        # late (e.g. a dead-letter worker waiting out a confirm lost in the restart) or lost.
        view = broker_view(rmq)
        started = time.monotonic()
        came = settle(rmq, tally, timeout=200)
        late = f"\nqueues after 60 s: {view}\n" + (
            f"settled {time.monotonic() - started:.0f} s later"
            if came
            else "still missing after 200 s more"
        )
    if not settled and alive:
        import signal  # debug: dump every thread's stack (faulthandler) before stopping

        proc.send_signal(signal.SIGABRT)
    out = stop(proc)
    (rmq.log.parent / "consumer.out").write_text(out)
    print("consumer output:", rmq.log.parent / "consumer.out")
    record(
        "2 broker restarted",
        published=published,
        handled=tally.handled_ok,
        parked=tally.parked_count,
        duplicates=tally.duplicates,
        lost=len(lost_then),
        notes=f"{len(expected)} (receiver, id) pairs, {waiting} in delay levels at stop, {refused} publishes refused while down "
        f"(caller told), consumer reconnects {out.count('reconnecting in')}"
        + (f", lost in a classic dead-letter hop: {in_hop}" if in_hop else "")
        + (f", {late.strip()}" if late else ""),
    )
    assert alive, "the consumer exited instead of reconnecting:\n" + out[-3000:]
    # Classic queues dead-letter at-most-once inside RabbitMQ (docs/explanation/delays.md):
    # a retry copy the broker confirmed can vanish in the delay-level hop that falls due as
    # it stops. How many depends on how long the node takes to stop, i.e. on the host's load
    # (one or two on a quiet host, more beside other suites), so the bound is physical, not
    # observed: only pairs that took a hop, no more than the copies the delay levels held
    # when the broker stopped, nothing left in any queue, and never with quorum queues. The
    # count table shows every such loss.
    assert settled or 0 < len(in_hop) <= waiting, (
        f"{lost_then[:20]}{late}\n{depths(rmq)}\n{out[-2000:]}"
    )
    assert [k for k in lost_then if k not in in_hop] == []
    assert [w for w in tally.wrong_outcome() if "got nothing" not in w] == []
    assert "connection to RabbitMQ lost" in out or "cannot reach RabbitMQ" in out, out[-3000:]
    assert refused > 0  # the publisher really published into the outage


def broker_view(rmq) -> list[str]:
    """This test's queues that hold anything, as the broker lists them (ready, unacked)."""
    listed = subprocess.run(
        rabbitmqctl_cmd(
            "list_queues",
            "-q",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [
        line.strip()
        for line in listed.splitlines()
        if line.startswith(rmq.prefix) and line.split()[1:] != ["0", "0"]
    ]


def make_rows(rmq, n: int) -> None:
    rec = default_registry.find("gamma", rmq.prefix)
    now = timezone.now()
    props = {"content_type": "application/json", "delivery_mode": 2}
    ParkedMessage.objects.bulk_create(
        [
            ParkedMessage(
                park_key=f"{rmq.prefix}-{i}",
                receiver=rec.name,
                queue=rec.queue_name(rmq.prefix),
                exchange=rmq.names.work_exchange,
                routing_key="test.other",
                message_id=f"m{i}",
                body=json.dumps({"id": i}).encode(),
                body_size=10,
                content_type="application/json",
                properties={**props, "message_id": f"m{i}"},
                headers={},
                reason="exhausted",
                attempts=10,
                parked_at=now,
            )
            for i in range(n)
        ],
        batch_size=1000,
    )


def drain_ids(queue: str) -> Counter:
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    ch = conn.channel()
    ids: Counter = Counter()
    ch.basic_qos(prefetch_count=1000)
    for method, _props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=2):
        if method is None:
            break
        ids[json.loads(body)["id"]] += 1
    conn.close()
    return ids


@pytest.mark.parametrize("fault", ["stop_app", "close_connection"])
def test_bulk_requeue_interrupted_by_the_broker(rmq, fault):
    """Scenario 8: the broker drops the requeue's connection mid-run; rerunning completes it,
    no row is published twice, none is skipped (messages in the queue counted against rows)."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    n = 10_000
    make_rows(rmq, n)
    queue = rmq.queue("gamma")
    fired = threading.Event()
    errors: list[BaseException] = []

    def inject() -> None:
        try:
            probe = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
            ch = probe.channel()
            while ch.queue_declare(queue, passive=True).method.message_count < n // 3:
                time.sleep(0.05)
            probe.close()
            if fault == "stop_app":
                with broker_stopped():
                    fired.set()
                    time.sleep(3)
            else:
                # The requeue's connection, by the name it gives the broker.
                name = f"django-rmq-retry publisher {app_settings.PREFIX} pid {os.getpid()}"
                assert close_connections(name) == 1
                fired.set()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=inject)
    t.start()
    runs = []
    t0 = time.monotonic()
    for _ in range(5):
        try:
            res = parking.requeue(ParkedMessage.objects.all(), user="faults", batch_size=500)
            runs.append(f"requeued {res.requeued} failed {res.failed}")
            if not ParkedMessage.objects.exclude(status=ParkedStatus.REQUEUED).exists():
                break
        except PublishError as exc:
            runs.append(f"stopped: {str(exc)[:60]}")
            wait_for(lambda: _broker_reachable() is None, 60, 0.5)
    t.join(120)
    elapsed = time.monotonic() - t0
    assert not errors, errors
    assert fired.is_set()
    # Until the queue holds a copy of every row (a restarted node recovers it a moment
    # later); a wait, not a bound: drain_ids counts what is there.

    def all_in() -> bool:
        try:
            return rmq.depth(queue) >= n
        except Exception:  # the test's own connection did not live through the restart
            return False

    wait_for(all_in, 60, 0.5)
    ids = drain_ids(queue)
    rows = Counter(ParkedMessage.objects.values_list("status", "requeue_count"))
    dups = sum(c - 1 for c in ids.values() if c > 1)
    missing = n - len(ids)
    record(
        f"8 requeue 10k, {fault}",
        published=n,
        handled=sum(ids.values()),
        parked=ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count(),
        duplicates=dups,
        lost=missing,
        notes=f"runs: {'; '.join(runs)}; rows {dict(rows)}; {elapsed:.0f}s",
    )
    # Rows: each requeued exactly once (claims + mark-after-confirm), none skipped.
    assert rows == {(ParkedStatus.REQUEUED, 1): n}, rows
    assert missing == 0
    # Wire: publishes whose confirms the dropped connection swallowed are sent again
    # (at-least-once; both copies carry the same parked-id and requeued headers). One drop,
    # at most one confirm window of duplicates.
    assert dups <= parking.REQUEUE_WINDOW, [k for k, c in ids.items() if c > 1][:10]
