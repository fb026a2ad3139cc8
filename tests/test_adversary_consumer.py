"""Give-backs that used to loop, and broker events the consumer used to miss (issue 12).

Each story runs a real ``rmq_consume`` child against the real broker and counts receiver
runs from the handling log: every path that gives a delivery back to its queue must end in
a parked row (or a held one) within ``DELIVERY_LIMIT`` runs, and nothing may be lost. None
of these disturbs the broker for others: policies and deletions touch this test's prefix only.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
from collections.abc import Iterator

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from django_rmq_retry.models import DeliveryStart, ParkedMessage
from tests.conftest import BROKER_URL, Child, rabbitmqctl_cmd, read_log, wait_for
from tests.faults.conftest import kill, spawn, stop
from tests.testapp.events import other, work
from tests.waiting import consuming

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LIMIT = 5  # tests/settings.py: DELIVERY_LIMIT


@pytest.fixture
def procs() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for p in started:
        if p.poll() is None:
            kill(p)


def runs(rmq, ident, event="start") -> int:
    return sum(1 for e in read_log(rmq.log) if e["event"] == event and e["id"] == ident)


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        rabbitmqctl_cmd("-q", *args), check=True, capture_output=True, text=True, timeout=60
    ).stdout


def unacked(queue: str) -> int:
    """Deliveries of ``queue`` a consumer holds unacked (the management counters, via CLI)."""
    for line in rabbitmqctl("list_queues", "name", "messages_unacknowledged").splitlines():
        name, _, count = line.rpartition("\t")
        if name == queue:
            return int(count)
    raise AssertionError(f"no queue {queue}")


def refused_by_broker(queue: str) -> bool:
    """Whether a confirmed publish straight into ``queue`` is refused (the policy applies)."""
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        try:
            ch.basic_publish("", queue, b"probe", mandatory=True)
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
            return True
        ch.queue_purge(queue)
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def delay_queues_refuse(rmq) -> Iterator[None]:
    """A ``max-length 0`` / ``reject-publish`` policy on this test's delay queues only."""
    name = f"{rmq.prefix}-refuse"
    rabbitmqctl(
        "set_policy",
        "--apply-to",
        "queues",
        "--priority",
        "100",
        name,
        rf"^{rmq.prefix}\.delay\.",
        '{"max-length": 0, "overflow": "reject-publish"}',
    )
    try:
        assert wait_for(lambda: refused_by_broker(rmq.names.delay_queue(0)), 15, 0.3)
        yield
    finally:
        rabbitmqctl("clear_policy", name)


@pytest.mark.parametrize("refusal", ["reject-publish policy", "delay queues deleted"])
def test_a_retry_copy_the_broker_keeps_refusing_ends_parked_after_the_limit(rmq, procs, refusal):
    """The copy is nacked (policy) or returned (no queue): the original goes back to its
    queue each time, and used to re-run its receiver without bound."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    proc = spawn(rmq, "alpha", "--threads", "2")
    procs.append(proc)
    consuming(rmq, rmq.queue("alpha"), child=proc)  # started: Django, then the broker
    for i in range(10):
        work.send({"id": i})
    # Once it consumes (it declares the topology when it connects), the copies' way closes.
    assert wait_for(lambda: all(runs(rmq, i, "done") == 1 for i in range(10)), 30)
    ctx: contextlib.AbstractContextManager[None]
    if refusal == "delay queues deleted":
        for level in range(40):
            with contextlib.suppress(Exception):
                rmq.ch().queue_delete(rmq.names.delay_queue(level))
        ctx = contextlib.nullcontext()
    else:
        ctx = delay_queues_refuse(rmq)
    with ctx:
        # A 1 s retry crosses the levels (a shorter one than the landing would skip them).
        work.send({"id": "refused", "fail": 1, "only": ["alpha"], "retry_delay": 1})
        parked = wait_for(
            lambda: ParkedMessage.objects.filter(receiver__endswith="alpha").exists(), 60, 0.5
        )
        time.sleep(2)  # a loop that is not bounded keeps going: let it show
        n = runs(rmq, "refused")
        out = stop(proc)
    row = ParkedMessage.objects.filter(receiver__endswith="alpha").first()
    print(f"\nCOUNTS refusal={refusal!r} receiver runs before park={n} parked={row is not None}")
    assert parked, f"never parked after {n} runs\n{out[-3000:]}"
    assert n == LIMIT, f"{n} receiver runs (limit {LIMIT})"
    assert row is not None and row.reason == "delivery_limit"
    assert "refused its retry copy" in row.reason_detail, row.reason_detail
    assert ("nacked" if "policy" in refusal else "returned as unroutable") in row.reason_detail
    assert {i: runs(rmq, i, "done") for i in range(10)} == {i: 1 for i in range(10)}
    assert rmq.depth(rmq.queue("alpha")) == 0
    assert not DeliveryStart.objects.exists()  # settled: nothing left counting


@contextlib.contextmanager
def parked_rows_refused(prefix: str) -> Iterator[None]:
    """A trigger that refuses every parked row of this test's prefix, even stripped."""
    table = ParkedMessage._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            cur.execute(
                f"CREATE TRIGGER refuse_{prefix} BEFORE INSERT ON {table} "
                f"WHEN NEW.queue LIKE '{prefix}.%' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the operator''s trigger'); END"
            )
        else:
            cur.execute(
                f"CREATE FUNCTION refuse_{prefix}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'refused by the operator''s trigger'; END $$"
            )
            cur.execute(
                f"CREATE TRIGGER refuse_{prefix} BEFORE INSERT ON {table} FOR EACH ROW "
                f"WHEN (NEW.queue LIKE '{prefix}.%') EXECUTE FUNCTION refuse_{prefix}()"
            )
    try:
        yield
    finally:
        drop_refusal(prefix)


def drop_refusal(prefix: str) -> None:
    table = ParkedMessage._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            cur.execute(f"DROP TRIGGER IF EXISTS refuse_{prefix}")
        else:
            cur.execute(f"DROP TRIGGER IF EXISTS refuse_{prefix} ON {table}")
            cur.execute(f"DROP FUNCTION IF EXISTS refuse_{prefix}()")


def test_a_row_the_database_refuses_even_stripped_is_held_not_looped(rmq, procs):
    """It used to be released: the receiver ran again, was refused again, for ever. Now it
    is held unacked (said once), tried again with a backoff, and parked once the database
    takes it; the messages behind it flow meanwhile."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("alpha")
    with parked_rows_refused(rmq.prefix):
        work.send({"id": "held", "reject": True, "only": ["alpha"]})
        proc = spawn(rmq, "alpha", "--threads", "2")
        procs.append(proc)
        consuming(rmq, queue, child=proc)  # started: Django, then the broker
        assert wait_for(lambda: runs(rmq, "held") >= 1, 30)
        for i in range(10):
            work.send({"id": i})
        assert wait_for(lambda: all(runs(rmq, i, "done") == 1 for i in range(10)), 30)
        time.sleep(6)  # several hold retries
        n_held = runs(rmq, "held")
        held_unacked = unacked(queue)
        assert not ParkedMessage.objects.filter(receiver__endswith="alpha").exists()
    assert wait_for(
        lambda: ParkedMessage.objects.filter(receiver__endswith="alpha").exists(), 30, 0.5
    ), "the held row was never parked once the database took it"
    assert wait_for(lambda: unacked(queue) == 0, 15, 0.5)
    out = stop(proc)
    n_total = runs(rmq, "held")
    print(
        f"\nCOUNTS held: receiver runs while refused={n_held} total={n_total} "
        f"unacked while held={held_unacked} refusals logged="
        f"{out.count('refuses the row of message')}"
    )
    assert n_held == 1 and n_total == 1, f"receiver ran {n_held} times while refused"
    assert held_unacked == 1  # held, not acked, not lost
    assert out.count("refuses the row of message") == 1, out[-3000:]
    row = ParkedMessage.objects.get(receiver__endswith="alpha")
    assert row.reason == "rejected"
    assert rmq.depth(queue) == 0


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"),
    reason="another writer holding SQLite's lock past its timeout",
)
def test_a_row_met_by_a_database_lock_is_held_and_parked_whole_never_stripped(rmq, procs):
    """Another connection holds SQLite's write lock past the consumer's timeout (1 s here):
    "database is locked" once counted as the database refusing the row, which was tried
    alone, then stripped of its headers and properties and parked so, as soon as the lock
    was gone. Now the row is held unacked and parked whole."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("alpha")
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # the write lock, as a long write transaction holds it
        work.send({"id": "locked", "reject": True, "only": ["alpha"]}, headers={"note": "keep"})
        proc = spawn(rmq, "alpha", RMQ_TEST_SQLITE_TIMEOUT="1")
        procs.append(proc)
        consuming(rmq, queue, child=proc)  # started: Django, then the broker
        assert wait_for(lambda: runs(rmq, "locked") == 1, 30)
        # The batch fails after 1 s, the row alone after 2: the stripped row would wait for
        # the lock and be stored once it is released, here.
        time.sleep(2.5)
        assert unacked(queue) == 1  # held: not acked, not given back
    finally:
        holder.rollback()
        holder.close()
    assert wait_for(lambda: ParkedMessage.objects.exists(), 30)
    assert wait_for(lambda: unacked(queue) == 0, 15, 0.5)
    out = stop(proc)
    row = ParkedMessage.objects.get()
    assert (row.reason, row.headers.get("note")) == ("rejected", "keep"), row.reason_detail
    assert "without its headers" not in out and "database unavailable or busy" in out, out[-2000:]
    assert runs(rmq, "locked") == 1 and rmq.depth(queue) == 0


def test_a_slow_message_retried_handler_does_not_hold_up_acks(rmq, procs):
    """Signal handlers ran on the connection's I/O thread: while one slept, no ack (and no
    heartbeat) went out and no new delivery came in."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("gamma")
    other.send({"id": "alerting", "fail": 1})
    release = rmq.log.with_name("release-handler")
    # The handler sleeps until the test releases it (at most 300 s, a deadline, not a bound).
    proc = spawn(
        rmq,
        "gamma",
        "--threads",
        "2",
        RMQ_TEST_SLOW_RETRY_SIGNAL="300",
        RMQ_TEST_SLOW_RETRY_RELEASE=str(release),
    )
    procs.append(proc)
    assert wait_for(lambda: runs(rmq, "alerting", "signal-start") == 1, 120)
    t0 = time.monotonic()
    for i in range(20):
        other.send({"id": i})

    def flowed_now() -> bool:
        return (
            all(runs(rmq, i, "done") == 1 for i in range(20))
            and rmq.depth(queue) == 0
            and unacked(queue) == 0
        )

    # Order, not a wall-clock window: the 20 acks are seen while the handler still sleeps,
    # which it does until the test releases it below (however slow the host is).
    wait_for(lambda: flowed_now() or runs(rmq, "alerting", "signal-end") > 0, 120, 0.3)
    flowed = flowed_now()
    took = time.monotonic() - t0
    still_sleeping = runs(rmq, "alerting", "signal-end") == 0
    release.touch()
    assert wait_for(lambda: runs(rmq, "alerting", "done") == 1, 60)
    stop(proc)
    print(f"\nCOUNTS slow signal: 20 acked in {took:.1f}s while the handler slept={still_sleeping}")
    assert flowed, f"acks held up by the slow handler ({took:.1f}s)"
    assert still_sleeping
    assert {i: runs(rmq, i, "done") for i in range(20)} == {i: 1 for i in range(20)}


def test_a_receiver_queue_deleted_under_a_running_consumer_is_declared_again(rmq, procs):
    """The broker cancels the consumer (basic.cancel); it used to go unnoticed, and the
    queue was never consumed again."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("gamma")
    proc = spawn(rmq, "gamma", "--threads", "2")
    procs.append(proc)
    consuming(rmq, queue, child=proc)  # started: Django, then the broker
    for i in range(3):
        other.send({"id": i})
    assert wait_for(lambda: all(runs(rmq, i, "done") == 1 for i in range(3)), 30)
    rmq.ch().queue_delete(queue)

    def consumed_again() -> bool:
        """Declared, bound and consumed: the consumer declares the topology, then consumes
        (a queue that merely exists may not be bound yet: a send would come back)."""
        try:
            return rmq.consumers(queue) >= 1
        except Exception:
            return False

    back = wait_for(consumed_again, 30, 0.3)
    if back:
        for i in range(3, 13):
            other.send({"id": i})
        wait_for(lambda: all(runs(rmq, i, "done") == 1 for i in range(3, 13)), 30)
    out = stop(proc)
    done = {i: runs(rmq, i, "done") for i in range(13)}
    print(f"\nCOUNTS queue deleted: declared again={back} handled={sum(done.values())}/13")
    assert back, f"the consumer never noticed the deletion\n{out[-3000:]}"
    assert done == {i: 1 for i in range(13)}
    assert "cancelled" in out, out[-3000:]
