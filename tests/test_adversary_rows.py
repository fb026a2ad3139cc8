"""Rows keep their story, and our headers are untrusted input (issue #12), on the real broker.

Each test tells one small story an adversary (or an ordinary foreign publisher, or a
receiver that forwards headers for tracing) can tell, and counts receiver runs and rows end
to end. Loop-prone stories run the consumer as a child with a deadline, so a regression
shows as a count, never as a hung test run.
"""

from __future__ import annotations

import gc
import glob
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
from django.core.management import call_command
from django.utils import timezone

from django_rmq_retry import Topic, parking, signals
from django_rmq_retry.conf import current_names
from django_rmq_retry.models import ParkedClaim, ParkedMessage, RequeueOperation
from django_rmq_retry.parking import operations
from tests.conftest import ROOT, read_log, start_consumer, subprocess_env, wait_for
from tests.testapp.events import work

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def consume(*receivers: str, idle: float = 2.5) -> None:
    call_command("rmq_consume", *receivers, max_idle_time=idle, verbosity=0)


def starts(log, receiver: str) -> Counter:
    return Counter(
        e["id"] for e in read_log(log) if e["event"] == "start" and e["receiver"] == receiver
    )


def foreign_publish(rmq, exchange: str, key: str, body: bytes, headers: dict, **props: Any) -> None:
    """Publish as a client that is not ours would (pika directly, no message id unless given)."""
    props.setdefault("content_type", "application/json")
    rmq.ch().basic_publish(
        exchange, key, body, pika.BasicProperties(headers=headers, delivery_mode=2, **props)
    )


def run_child(rmq, *receivers: str, deadline: float = 40.0, **env: str) -> str:
    """A consumer child that must go idle (and exit) on its own; killed at ``deadline``."""
    child = start_consumer(rmq.prefix, rmq.log, *receivers, "--max-idle-time", "3", **env)
    try:
        child.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        child.kill()
    out, _ = child.communicate(timeout=10)
    return out


# USE_TZ = False ----------------------------------------------------------------------------
def test_parking_works_without_time_zones(rmq):
    """A project with USE_TZ = False parks like any other: 3 runs, one row, no loop."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    work.send({"id": 1, "fail": "always", "only": ["alpha"]})
    out = run_child(rmq, "alpha", RMQ_TEST_USE_TZ="false")
    runs = starts(rmq.log, "alpha")
    assert runs == {1: 3}, (runs, out[-2000:])
    row = ParkedMessage.objects.get()
    assert (row.status, row.reason, row.attempts) == ("parked", "exhausted", 3)
    assert rmq.depth(rmq.queue("alpha")) == 0
    # Requeue without time zones too (claims compare times), and the copy returns to its row.
    requeue = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "rmq_requeue", f"--id={row.pk}", "--no-progress"],
        env=subprocess_env(rmq.prefix, rmq.log, RMQ_TEST_USE_TZ="false"),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert requeue.returncode == 0, requeue.stderr[-2000:]
    out = run_child(rmq, "alpha", RMQ_TEST_USE_TZ="false")
    assert starts(rmq.log, "alpha") == {1: 6}, out[-2000:]
    row = ParkedMessage.objects.get()
    assert (row.status, row.park_count, row.requeue_count) == ("parked", 2, 1)


# A new failure never merges into a finished row --------------------------------------------
@pytest.mark.parametrize("ending", ["requeued", "discarded"])
def test_an_identical_failure_after_the_first_ended_gets_a_row_of_its_own(
    rmq, registry_snapshot, ending
):
    """No message id, the same body twice: the second failure is parked, not swallowed."""
    topic = Topic("adv.same")
    state = {"fail": True}
    runs: list[int] = []

    @topic.connect
    def same(message, **kwargs):
        runs.append(message.attempt)
        if state["fail"]:
            raise ValueError("down")

    call_command("rmq_consume", setup_only=True, verbosity=0)
    body = b'{"order": 7}'
    foreign_publish(rmq, rmq.names.work_exchange, "adv.same", body, {})
    consume("same")
    first = ParkedMessage.objects.get()
    if ending == "requeued":
        state["fail"] = False
        assert parking.requeue(ParkedMessage.objects.all()).requeued == 1
        consume("same")  # handled this time
    else:
        assert parking.discard(ParkedMessage.objects.all()) == 1
    state["fail"] = True
    foreign_publish(rmq, rmq.names.work_exchange, "adv.same", body, {})
    consume("same")
    assert runs == [1, 2, 3, *([1] if ending == "requeued" else []), 1, 2, 3]
    first.refresh_from_db()
    assert (first.status, first.park_count) == (ending, 1)
    second = ParkedMessage.objects.get(status="parked")
    assert second.pk != first.pk and bytes(second.body) == body and second.attempts == 3


def test_a_redelivered_parking_of_the_same_delivery_still_keeps_one_row():
    """The dedupe that stays: a redelivery after a lost ack finds its parked row."""
    req = parking.ParkRequest(
        receiver="r",
        queue="p.r",
        exchange="p.work",
        routing_key="k",
        body=b"{}",
        properties={"headers": {}},
        reason="exhausted",
        reason_detail="",
        attempts=3,
        redelivered=False,
    )
    row, created = parking.park(req)
    again, created_again = parking.park(
        parking.ParkRequest(**{**req.__dict__, "redelivered": True})
    )
    assert created and not created_again and row.pk == again.pk


# Requeue to the topic: each sibling keeps its own row ------------------------------------
def test_siblings_failing_on_a_topic_requeue_each_keep_their_row(rmq, registry_snapshot):
    topic = Topic("adv.sib")
    failing = {"sib_a"}
    runs: Counter = Counter()

    def make(name):
        def rec(message, **kwargs):
            runs[name] += 1
            if name in failing:
                raise ValueError(f"{name} down")

        rec.__name__ = rec.__qualname__ = name
        return rec

    sib_a, sib_b = make("sib_a"), make("sib_b")
    topic.connect(sib_a)
    topic.connect(sib_b)
    call_command("rmq_consume", setup_only=True, verbosity=0)
    topic.send({"n": 1})
    consume("sib_a", "sib_b")
    row_a = ParkedMessage.objects.get()
    assert row_a.receiver.endswith("sib_a") and runs == {"sib_a": 3, "sib_b": 1}
    failing.add("sib_b")
    result = parking.requeue(ParkedMessage.objects.all(), mode=parking.MODE_TOPIC)
    assert result.requeued == 1
    consume("sib_a", "sib_b")
    assert runs == {"sib_a": 6, "sib_b": 4}
    rows = {r.receiver.rsplit(".", 1)[-1]: r for r in ParkedMessage.objects.all()}
    assert set(rows) == {"sib_a", "sib_b"}, rows
    assert rows["sib_a"].pk == row_a.pk and rows["sib_a"].park_count == 2
    assert rows["sib_a"].status == rows["sib_b"].status == "parked"
    assert rows["sib_b"].park_count == 1 and rows["sib_b"].error_message == "sib_b down"


# Forwarded headers -------------------------------------------------------------------------
def test_headers_forwarded_to_another_topic_start_a_fresh_story(rmq, registry_snapshot):
    first_topic, second_topic = Topic("adv.fwd.one"), Topic("adv.fwd.two")
    seen: list[tuple[int, str, str, Any]] = []

    @first_topic.connect
    def forwarder(message, **kwargs):
        if message.attempt == 1:
            raise ValueError("first attempt fails")
        second_topic.send(message.body, headers=message.headers)  # e.g. for tracing

    @second_topic.connect
    def sink(message, **kwargs):
        seen.append(
            (message.attempt, message.routing_key, message.exchange, message.headers.get("trace"))
        )

    call_command("rmq_consume", setup_only=True, verbosity=0)
    first_topic.send({"n": 1}, headers={"trace": "abc"})
    consume("forwarder", "sink")
    assert seen == [(1, "adv.fwd.two", rmq.names.work_exchange, "abc")]


# Forged reserved headers -------------------------------------------------------------------
@pytest.mark.parametrize("status", ["parked", "requeued", "discarded"])
def test_a_forged_parked_id_never_touches_another_row(rmq, status):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    work.send({"id": 1, "fail": "always", "only": ["alpha"]})
    consume("alpha", "beta")
    ParkedMessage.objects.update(status=status, requeue_count=1)
    victim = ParkedMessage.objects.get()
    h = rmq.names.header
    forged = {h("parked-id"): str(victim.pk), h("requeued"): 1}
    body = b'{"id": 2, "fail": "always"}'  # fails in alpha (the victim's receiver) and beta
    foreign_publish(rmq, rmq.names.work_exchange, "test.work", body, forged, message_id="evil")
    consume("alpha", "beta")
    before = (victim.status, victim.park_count, bytes(victim.body), victim.message_id)
    victim.refresh_from_db()
    assert (victim.status, victim.park_count, bytes(victim.body), victim.message_id) == before
    assert victim.status == status
    fresh = ParkedMessage.objects.exclude(pk=victim.pk)
    assert sorted(r.receiver.rsplit(".", 1)[-1] for r in fresh) == ["alpha", "beta"]
    assert {bytes(r.body) for r in fresh} == {body}
    assert starts(rmq.log, "alpha")[2] == 3 and starts(rmq.log, "beta")[2] == 3


def test_forged_retry_headers_from_a_foreign_publisher_are_ignored(rmq):
    """Attempt, first failure and original route on a message sent to the work exchange."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    h = rmq.names.header
    cases = {
        1: {h("attempt"): 3, h("first-failure"): "0001-01-01T00:00:00+05:00"},
        2: {h("attempt"): 10**12, h("first-failure"): "9999-12-31T23:59:59-05:00"},
        3: {h("attempt"): "2", h("first-failure"): "not a time"},
        4: {h("original-exchange"): "forged.ex", h("original-routing-key"): "forged.key"},
    }
    for n, headers in cases.items():
        body = f'{{"id": {n}, "fail": "always", "only": ["alpha"]}}'.encode()
        foreign_publish(rmq, rmq.names.work_exchange, "test.work", body, headers)
    out = run_child(rmq, "alpha")
    assert starts(rmq.log, "alpha") == {1: 3, 2: 3, 3: 3, 4: 3}, out[-3000:]
    rows = ParkedMessage.objects.all()
    assert len(rows) == 4
    recent = timezone.now() - timedelta(minutes=5)
    for row in rows:
        assert (row.attempts, row.reason) == (3, "exhausted")
        assert (row.exchange, row.routing_key) == (rmq.names.work_exchange, "test.work")
        assert row.first_failure_at >= recent
    # A requeue to the topic goes to the key the message really had, not the forged one.
    result = parking.requeue(ParkedMessage.objects.all(), mode=parking.MODE_TOPIC)
    assert result.requeued == 4 and rmq.depth(rmq.queue("alpha")) == 4


def test_reserved_headers_on_our_own_route_are_still_validated(rmq):
    """Even a copy arriving through the deliver exchange is checked value by value."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    h = rmq.names.header
    target = rmq.queue("alpha")
    cases = {
        1: {h("attempt"): 3, h("first-failure"): "0001-01-01T00:00:00+05:00"},
        2: {h("attempt"): 3, h("first-failure"): "9999-12-31T23:59:59-05:00"},
        3: {h("attempt"): 10**12},
        4: {h("attempt"): 3, h("first-failure"): 12345},
    }
    for n, headers in cases.items():
        body = f'{{"id": {n}, "fail": "always"}}'.encode()
        foreign_publish(
            rmq, rmq.names.deliver_exchange, "", body, {**headers, rmq.names.target_header: target}
        )
    out = run_child(rmq, "alpha")
    assert starts(rmq.log, "alpha") == {1: 1, 2: 1, 3: 3, 4: 1}, out[-3000:]
    rows = ParkedMessage.objects.all()
    assert len(rows) == 4
    recent = timezone.now() - timedelta(minutes=5)
    assert all(r.first_failure_at >= recent and r.attempts == 3 for r in rows)
    assert starts(rmq.log, "beta") == {}
    assert rmq.depth(target) == 0


# Requeue memory ------------------------------------------------------------------------------
def test_requeue_memory_stays_flat_for_large_bodies(rmq):
    """2,000 rows of 256 KiB (500 MiB of bodies): the requeue's peak stays a few chunks."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("alpha")
    body = os.urandom(256 * 1024)
    now = timezone.now()
    for start in range(0, 2000, 100):
        ParkedMessage.objects.bulk_create(
            ParkedMessage(
                park_key=f"mem-{i}",
                receiver="tests.testapp.consumers.alpha",
                queue=queue,
                exchange=rmq.names.work_exchange,
                routing_key="test.work",
                message_id=f"mem-{i}",
                body=body,
                body_size=len(body),
                content_type="application/octet-stream",
                properties={"content_type": "application/octet-stream", "message_id": f"mem-{i}"},
                reason="exhausted",
                parked_at=now,
            )
            for i in range(start, start + 100)
        )
    del body
    gc.collect()
    tracemalloc.start()
    try:
        began = time.monotonic()
        result = parking.requeue(ParkedMessage.objects.all())
        took = time.monotonic() - began
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\nrequeue of 2,000 x 256 KiB: peak {peak / 2**20:.1f} MiB traced, {took:.1f} s")
    assert result.requeued == 2000 and result.failed == 0
    assert ParkedMessage.objects.filter(status="requeued").count() == 2000
    assert rmq.depth(queue) == 2000
    assert peak < 40 * 2**20, f"peak {peak / 2**20:.1f} MiB"


# Admin requeue and ATOMIC_REQUESTS -----------------------------------------------------------
def test_admin_requeue_commits_its_marks_even_with_atomic_requests(rmq, client):
    """With ATOMIC_REQUESTS the admin's requeue still commits its operation before it returns
    (another process steps it), and the step commits each row's mark as it goes: another
    connection (a consumer meeting the requeued copy) sees the row requeued."""
    from django.contrib.auth.models import User
    from django.db import connection, connections
    from django.urls import reverse

    call_command("rmq_consume", setup_only=True, verbosity=0)
    work.send({"id": 1, "fail": "always", "only": ["alpha"]})
    consume("alpha", "beta")
    row = ParkedMessage.objects.get()
    seen: list[tuple[bool, str]] = []  # (request in a transaction?, status seen elsewhere)

    def look(sender, parked_ids, **kwargs):
        statuses: list[str] = []

        def other_connection():
            try:
                statuses.append(ParkedMessage.objects.get(pk=parked_ids[0]).status)
            finally:
                connections.close_all()

        worker = threading.Thread(target=other_connection)
        worker.start()
        worker.join(30)
        seen.append((connection.in_atomic_block, *statuses))

    client.force_login(User.objects.create_superuser("root", password="pw"))
    signals.message_requeued.connect(look)
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        response = client.post(
            reverse("admin:django_rmq_retry_parkedmessage_changelist"),
            {
                "action": "requeue_selected",
                "_selected_action": [str(row.pk)],
                "index": "0",
                "select_across": "0",
            },
            follow=True,
        )
        assert response.status_code == 200
        # Another connection sees the operation the request started: it was committed.
        ops: list[int] = []
        worker = threading.Thread(
            target=lambda: (
                ops.extend(RequeueOperation.objects.values_list("total", flat=True)),
                connections.close_all(),
            )
        )
        worker.start()
        worker.join(30)
        assert ops == [1]
        assert rmq.depth(rmq.queue("alpha")) == 0  # nothing sent by the request
        assert operations.advance_due() == 1
    finally:
        connection.settings_dict["ATOMIC_REQUESTS"] = False
        signals.message_requeued.disconnect(look)
    assert seen == [(False, "requeued")]
    assert rmq.depth(rmq.queue("alpha")) == 1


# Publisher processes close their connection -------------------------------------------------
def _broker_log() -> Path:
    found = os.environ.get("RMQ_LOG") or next(
        iter(sorted(glob.glob("/var/log/rabbitmq/rabbit@*.log"), key=os.path.getmtime)[-1:]),
        None,
    )
    if not found or not os.access(found, os.R_OK):
        pytest.fail("the broker's log is needed: set RMQ_LOG to its path", pytrace=False)
    return Path(found)


@pytest.mark.parametrize("how", ["returns", "sys.exit"])
def test_a_process_that_published_closes_its_connection_when_it_exits(rmq, how):
    log = _broker_log()
    start = log.stat().st_size
    script = (
        "import django, sys; django.setup()\n"
        "from tests.testapp.events import work\n"
        "work.send({'id': 1})\n"
        "import os; print(os.getpid())\n" + ("sys.exit(0)\n" if how == "sys.exit" else "")
    )
    env = subprocess_env(rmq.prefix, rmq.log)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=str(ROOT), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    name = f"django-rmq-retry publisher {rmq.prefix} pid {done.stdout.strip()}"

    def closing_lines() -> list[str]:
        with open(log, errors="replace") as f:
            f.seek(start)
            lines = f.read().splitlines()
        out = []
        for i, line in enumerate(lines):
            if "closing AMQP connection" in line and name in line:
                out.append(line + " " + (lines[i + 1] if i + 1 < len(lines) else ""))
        return out

    assert wait_for(closing_lines, 60, 0.2)
    closed = closing_lines()
    assert len(closed) == 1, closed
    assert "unexpectedly" not in closed[0], closed[0]
    assert rmq.depth(rmq.queue("alpha")) == 1  # it did publish


# An IntegrityError that is not a racing duplicate ------------------------------------------
@pytest.mark.parametrize("claim", [False, True])
def test_a_constraint_of_yours_refusing_a_row_is_raised_not_retried(claim):
    """A CHECK or trigger of the project's refusing a row raises at once (the consumer's
    refused-row path takes over); only a racing duplicate key is looked up again."""
    from django.db import IntegrityError, connection
    from django.test.utils import CaptureQueriesContext

    table = ParkedMessage._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                f"CREATE TRIGGER refuse_boom BEFORE INSERT ON {table} "
                "WHEN NEW.error_type = 'Refused' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        else:
            cursor.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT refuse_boom CHECK (error_type <> 'Refused')"
            )
    try:
        headers = {"rmq_retry_test-parked-id": "1", "rmq_retry_test-requeued": 1} if claim else {}
        req = parking.ParkRequest(
            receiver="r",
            queue="p.r",
            exchange="p.work",
            routing_key="k",
            body=b"{}",
            properties={"headers": headers},
            reason="exhausted",
            reason_detail="",
            attempts=3,
            redelivered=False,
            error_type="Refused",
        )
        with CaptureQueriesContext(connection) as queries, pytest.raises(IntegrityError):
            parking.park(req)
        inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT")]
        assert len(inserts) <= 2, len(inserts)
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("DROP TRIGGER refuse_boom")
            else:
                cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT refuse_boom")
    assert ParkedMessage.objects.count() == 0


# The requeued-copy check, case by case (database only) --------------------------------------
def _req(headers: dict, **overrides: Any) -> parking.ParkRequest:
    values: dict[str, Any] = dict(
        receiver="r",
        queue="p.r",
        exchange="p.work",
        routing_key="k",
        body=b'{"n": 1}',
        properties={"message_id": "m1", "headers": headers},
        reason="exhausted",
        reason_detail="",
        attempts=3,
        redelivered=False,
    )
    values.update(overrides)
    return parking.ParkRequest(**values)


@pytest.mark.parametrize(
    ("status", "count", "claim", "overrides", "returns"),
    [
        ("requeued", 1, 1, {}, True),
        ("claimed", 0, 1, {}, True),  # the copy failed before the requeue marked its row
        ("requeued", 2, 1, {}, False),  # an older copy than the row's last requeue
        ("claimed", 1, 1, {}, False),
        ("parked", 0, 1, {}, False),  # never requeued (parked, no requeue claims it)
        ("discarded", 1, 1, {}, False),
        ("requeued", 1, 1, {"queue": "p.other", "receiver": "other"}, False),
        ("requeued", 1, 1, {"body": b'{"n": 2}'}, False),
        ("requeued", 1, 1, {"properties": {"message_id": "m2"}}, False),
    ],
)
def test_a_copy_returns_to_its_row_only_when_everything_agrees(
    status, count, claim, overrides, returns
):
    names = current_names()
    row, _ = parking.park(_req({}))
    if status == "claimed":  # parked, and a requeue run is publishing it
        ParkedClaim.objects.create(parked_id=row.pk, token="run", claimed_at=timezone.now())
        status = "parked"
    ParkedMessage.objects.filter(pk=row.pk).update(status=status, requeue_count=count)
    headers = {names.header("parked-id"): str(row.pk), names.header("requeued"): claim}
    props = {**_req({}).properties, **overrides.pop("properties", {}), "headers": headers}
    back, created = parking.park(_req(headers, properties=props, **overrides))
    assert (back.pk == row.pk) is returns and created is not returns
    assert ParkedMessage.objects.count() == (1 if returns else 2)
    row.refresh_from_db()
    assert row.status == ("parked" if returns else status)
    # A copy that came back before its requeue was marked still counts as a requeue.
    assert row.requeue_count == (claim if returns else count)
    if returns:  # the requeue's late mark, made only while its claim holds, will not apply
        assert not ParkedClaim.objects.filter(parked_id=row.pk).exists()
