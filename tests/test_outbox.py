"""The transactional outbox against the real broker and database: rows commit or roll back
with the sender's transaction, are published after the commit with confirms, are deleted only
once confirmed, keep their transaction's order, and survive a broker that is down."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_rmq_retry import Topic
from django_rmq_retry.models import OutboxMessage, OutboxStatus, RetryPolicy
from django_rmq_retry.outbox import RelayRound, publish_pending, relay
from django_rmq_retry.publishing.per_thread import reset_publisher
from tests.conftest import all_ready, held_until, read_log, start_consumer, wait_for
from tests.test_broker_edges import close_connections
from tests.testapp.events import other

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/%2F"


def _bodies(rmq, short="gamma") -> list[dict]:
    import json

    return [json.loads(body) for _m, _p, body in rmq.get_all(rmq.queue(short))]


def _conf(rmq, **extra):
    return {**settings.RMQ_RETRY, "PREFIX": rmq.prefix, **extra}


def test_rows_commit_with_the_transaction_and_are_published_after_it(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with transaction.atomic():
        RetryPolicy.objects.create(receiver="x.y")
        results = [other.send({"id": i}, outbox=True) for i in range(5)]
        assert OutboxMessage.objects.count() == 5  # written, in this transaction
        assert rmq.depth(rmq.queue("gamma")) == 0  # nothing leaves before the commit
        groups = set(OutboxMessage.objects.values_list("group", flat=True))
        assert len(groups) == 1  # one transaction, one group
    assert wait_for(lambda: rmq.depth(rmq.queue("gamma")) == 5, 60)
    got = rmq.get_all(rmq.queue("gamma"))
    assert [p.message_id for _m, p, _b in got] == [r.message_id for r in results]  # in order
    assert OutboxMessage.objects.count() == 0  # deleted once confirmed


def test_a_rolled_back_transaction_sends_nothing(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with pytest.raises(RuntimeError), transaction.atomic():
        other.send({"id": 1}, outbox=True)
        raise RuntimeError("rollback")
    assert OutboxMessage.objects.count() == 0
    assert rmq.depth(rmq.queue("gamma")) == 0


def test_a_rolled_back_savepoint_starts_a_new_group_and_keeps_the_rest(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with override_settings(RMQ_RETRY=_conf(rmq, OUTBOX=True, OUTBOX_PUBLISH_ON_COMMIT=False)):
        with transaction.atomic():
            other.send({"id": 1})
            try:
                with transaction.atomic():
                    other.send({"id": 2})
                    raise RuntimeError("inner rollback")
            except RuntimeError:
                pass
            other.send({"id": 3})
        rows = list(OutboxMessage.objects.order_by("id"))
        assert [r.routing_key for r in rows] == ["test.other", "test.other"]
        assert rows[0].group == rows[1].group  # the first callback survived the savepoint
        with transaction.atomic():
            other.send({"id": 4})
        assert OutboxMessage.objects.values("group").distinct().count() == 2
        call_command("rmq_relay", once=True, verbosity=0)
    assert [b["id"] for b in _bodies(rmq)] == [1, 3, 4]


def test_setting_topic_and_call_choose_the_outbox(rmq):
    direct = Topic("test.other", outbox=False)
    with override_settings(RMQ_RETRY=_conf(rmq, OUTBOX=True, OUTBOX_PUBLISH_ON_COMMIT=False)):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        other.send({"id": 1})  # the setting
        direct.send({"id": 2})  # the topic says no: published at once
        direct.send({"id": 3}, outbox=True)  # the call wins
        assert OutboxMessage.objects.count() == 2
        assert [b["id"] for b in _bodies(rmq)] == [2]
        call_command("rmq_relay", once=True, verbosity=0)
        assert [b["id"] for b in _bodies(rmq)] == [1, 3]
        assert OutboxMessage.objects.count() == 0


def test_a_broker_down_at_commit_keeps_the_rows_for_the_relay(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    down = _conf(rmq, BROKER_URL=UNREACHABLE, CONNECT_TIMEOUT=2)
    with override_settings(RMQ_RETRY=down):
        reset_publisher()
        with transaction.atomic():  # the commit succeeds: the outbox row is the promise
            RetryPolicy.objects.create(receiver="kept.with.the.event")
            other.send({"id": 7}, outbox=True)
        reset_publisher()
    assert RetryPolicy.objects.filter(receiver="kept.with.the.event").exists()
    assert OutboxMessage.objects.count() == 1
    assert rmq.depth(rmq.queue("gamma")) == 0
    call_command("rmq_relay", once=True, verbosity=0)  # the broker is back
    assert [b["id"] for b in _bodies(rmq)] == [7]
    assert OutboxMessage.objects.count() == 0


def test_unroutable_rows_back_off_then_are_held_for_an_operator(rmq, monkeypatch):
    nobody = Topic("test.nobody-listens")
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with override_settings(RMQ_RETRY=_conf(rmq, OUTBOX_MAX_ATTEMPTS=2)):
        before = timezone.now()
        nobody.send({"id": 1}, outbox=True)  # autocommit: published at once, returned
        row = OutboxMessage.objects.get()
        assert (row.status, row.attempts) == (OutboxStatus.PENDING, 1)
        assert "unroutable" in row.last_error and "test.nobody-listens" in row.last_error
        # Backing off: due the first refusal's delay after the round that published it, so
        # no sooner than that after the send (how much of it is left is the host's business).
        assert row.available_at >= before + timedelta(seconds=relay.REFUSED_FIRST_DELAY)
        with monkeypatch.context() as m:  # a round on the relay's clock, a moment before due
            just_before = row.available_at - timedelta(microseconds=1)
            m.setattr(relay, "timezone", SimpleNamespace(now=lambda: just_before))
            assert publish_pending().claimed == 0  # not due yet
        OutboxMessage.objects.update(available_at=timezone.now())
        assert publish_pending().held == 1
        row.refresh_from_db()
        assert (row.status, row.attempts) == (OutboxStatus.HELD, 2)
        OutboxMessage.objects.update(available_at=timezone.now())
        assert publish_pending().claimed == 0  # held rows wait for an operator


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="row locks between relays: PostgreSQL (SQLite relays take the database's write lock)",
)
def test_a_transaction_s_later_rows_wait_while_another_relay_holds_an_earlier_one(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with override_settings(RMQ_RETRY=_conf(rmq, OUTBOX_PUBLISH_ON_COMMIT=False)):
        with transaction.atomic():
            for i in range(3):
                other.send({"id": i}, outbox=True)
        with transaction.atomic():
            other.send({"id": 10}, outbox=True)
        first = OutboxMessage.objects.order_by("id").first()
        locked, release = threading.Event(), threading.Event()

        def other_relay() -> None:  # holds the group's first row, as a busy relay would
            try:
                with transaction.atomic():
                    OutboxMessage.objects.select_for_update().get(pk=first.pk)
                    locked.set()
                    release.wait(10)
            finally:
                connections.close_all()

        t = threading.Thread(target=other_relay)
        t.start()
        assert locked.wait(10)
        try:
            done = publish_pending()
        finally:
            release.set()
            t.join()
        assert done.published == 1  # only the other transaction's row
        assert done.waiting == 2  # a drain looks again from the oldest row
        assert [b["id"] for b in _bodies(rmq)] == [10]
        assert publish_pending().published == 3
        assert [b["id"] for b in _bodies(rmq)] == [0, 1, 2]


def test_a_refused_row_holds_back_its_transaction_s_later_rows_of_that_topic_only(rmq):
    """Order is kept per (transaction, topic): a row whose topic has an earlier row of its
    transaction backing off after a refusal waits with it; rows of other topics go."""
    nobody = Topic("test.nobody-listens")
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with override_settings(RMQ_RETRY=_conf(rmq, OUTBOX_PUBLISH_ON_COMMIT=False)):
        with transaction.atomic():
            nobody.send({"id": 1}, outbox=True)
            other.send({"id": 2}, outbox=True)
            nobody.send({"id": 3}, outbox=True)
        first = publish_pending(limit=1)
        assert (first.claimed, first.refused) == (1, 1)  # unroutable: backs off
        second = publish_pending()
        assert (second.claimed, second.published, second.refused) == (2, 1, 0)
        assert second.waiting == 0  # the row left is deferred, not waiting for a relay
        assert [b["id"] for b in _bodies(rmq)] == [2]
        later = OutboxMessage.objects.get(routing_key=nobody.routing_key, attempts=0)
        assert later.status == OutboxStatus.PENDING  # never tried: it would overtake id 1


def test_the_consumer_relays_rows_committed_elsewhere(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with (
        override_settings(RMQ_RETRY=_conf(rmq, OUTBOX_PUBLISH_ON_COMMIT=False)),
        transaction.atomic(),
    ):
        for i in range(20):
            other.send({"id": i}, outbox=True)
    assert OutboxMessage.objects.count() == 20
    connection.close()  # SQLite: let the child write
    child = start_consumer(rmq.prefix, rmq.log, "gamma", "--max-messages", "20")
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, out
    done = sorted(e["id"] for e in read_log(rmq.log) if e["event"] == "done")
    assert done == list(range(20))
    assert OutboxMessage.objects.count() == 0


def test_a_send_inside_a_transaction_costs_one_insert(rmq):
    from django.test.utils import CaptureQueriesContext

    call_command("rmq_consume", setup_only=True, verbosity=0)
    with transaction.atomic():
        RetryPolicy.objects.create(receiver="x.y")  # the transaction's own work
        with CaptureQueriesContext(connection) as first:
            other.send({"id": 1}, outbox=True)
        with CaptureQueriesContext(connection) as second:
            other.send({"id": 2}, outbox=True)
    assert [q["sql"].split()[0].upper() for q in first.captured_queries] == ["INSERT"]
    assert [q["sql"].split()[0].upper() for q in second.captured_queries] == ["INSERT"]
    assert wait_for(lambda: rmq.depth(rmq.queue("gamma")) == 2, 60)


def test_a_round_with_nothing_due_never_connects_to_the_broker(rmq, monkeypatch):
    # The refused row's first wait made long enough that a loaded host cannot make it due
    # before the round below (the default 1 s did, with CI's legs side by side).
    monkeypatch.setattr(relay, "REFUSED_FIRST_DELAY", 300.0)
    nobody = Topic("test.nobody-listens")
    call_command("rmq_consume", setup_only=True, verbosity=0)
    nobody.send({"id": 1}, outbox=True)  # refused once: backing off, not due
    with override_settings(RMQ_RETRY=_conf(rmq, BROKER_URL=UNREACHABLE, CONNECT_TIMEOUT=2)):
        reset_publisher()
        try:
            assert publish_pending() == RelayRound()  # no PublishError: no connection tried
        finally:
            reset_publisher()
    assert OutboxMessage.objects.get().attempts == 1


def test_send_many_through_the_outbox_is_one_insert_and_keeps_order(rmq):
    from django.test.utils import CaptureQueriesContext

    call_command("rmq_consume", setup_only=True, verbosity=0)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as captured:
            results = other.send_many([{"id": i} for i in range(5)], outbox=True)
        with pytest.raises(TypeError):  # a body that is not JSON serialisable writes nothing
            other.send_many([{"id": 9}, {"id": object()}], outbox=True)
    assert [q["sql"].split()[0].upper() for q in captured.captured_queries] == ["INSERT"]
    assert wait_for(lambda: rmq.depth(rmq.queue("gamma")) == 5, 60)
    got = rmq.get_all(rmq.queue("gamma"))
    assert [p.message_id for _m, p, _b in got] == [r.message_id for r in results]
    assert OutboxMessage.objects.count() == 0


def test_several_relays_share_the_rows_without_publishing_one_twice(rmq, procs_outbox):
    """Three ``rmq_relay`` processes at once, in rounds of 20 rows, on 3,000 rows from 300
    transactions: every row published exactly once (no kill, so no duplicate is allowed),
    each transaction's rows arrive in the order they were written, and (PostgreSQL) the work
    was shared."""
    import json

    from tests.conftest import subprocess_env

    call_command("rmq_consume", setup_only=True, verbosity=0)
    with override_settings(RMQ_RETRY=_conf(rmq, OUTBOX_PUBLISH_ON_COMMIT=False)):
        for t in range(300):
            with transaction.atomic():
                other.send_many([{"t": t, "i": i} for i in range(10)], outbox=True)
    connection.close()  # SQLite: let the children write
    env = subprocess_env(rmq.prefix, rmq.log, RMQ_OUTBOX_BATCH="20")
    go = rmq.log.with_name("go")  # the relays start together once all three are up
    starter = held_until(
        go, "from django.core.management import call_command\ncall_command('rmq_relay', once=True)"
    )
    for _ in range(3):
        procs_outbox(["shell", "-c", starter], env)
    all_ready(go, 3)
    go.write_text("go")
    published = []
    for child in procs_outbox.started:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0, out
        published.append(int(out.split("Stopped: ")[1].split(" published")[0]))
    print(f"\nrows published per relay: {published}")
    assert sum(published) == 3000
    if connection.vendor == "postgresql":  # SQLite's relays take turns on its write lock
        assert sorted(published)[1] > 0, published  # at least two relays did some of it
    assert OutboxMessage.objects.count() == 0
    got = [json.loads(body) for _m, _p, body in rmq.get_all(rmq.queue("gamma"))]
    assert len(got) == 3000
    assert len({(b["t"], b["i"]) for b in got}) == 3000  # none twice
    by_transaction: dict[int, list[int]] = {}
    for body in got:
        by_transaction.setdefault(body["t"], []).append(body["i"])
    assert all(order == list(range(10)) for order in by_transaction.values())


@pytest.fixture
def procs_outbox(tmp_path):
    """Start ``manage.py`` children (output to files); kill any left at the end."""
    import sys
    import uuid

    from tests.conftest import ROOT, Child

    started: list[Child] = []

    def start(args: list[str], env: dict[str, str]) -> Child:
        out = tmp_path / f"child-{uuid.uuid4().hex[:8]}.out"
        child = Child([sys.executable, str(ROOT / "manage.py"), *args], env, out)
        started.append(child)
        return child

    start.started = started  # type: ignore[attr-defined]
    yield start
    for child in started:
        if child.poll() is None:
            child.kill()


def test_a_connection_lost_mid_round_keeps_every_unconfirmed_row(rmq, monkeypatch):
    """The connection dies while a round is still reading ahead (chunks of 20, 300 rows),
    once the broker confirmed the first 150: the round stops its reader, deletes only those
    150, and the next round publishes the rest; every message arrives once (the broker
    closes the connection by its name, and the round publishes nothing after that)."""
    from django_rmq_retry import PublishError
    from django_rmq_retry.outbox import publish_all, relay
    from django_rmq_retry.publishing.per_thread import get_publisher

    monkeypatch.setattr(relay, "CHUNK", 20)
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with override_settings(RMQ_RETRY=_conf(rmq, OUTBOX_PUBLISH_ON_COMMIT=False)):
        with transaction.atomic():
            results = other.send_many([{"id": i} for i in range(300)], outbox=True)
        publisher = get_publisher()
        name = f"django-rmq-retry publisher {rmq.prefix} pid {os.getpid()}"

        class CutAfter150:
            def stream_items(self, items):
                def cut():
                    for n, item in enumerate(items):
                        if n == 150:  # the first 150 sent and confirmed, then the cut
                            deadline = time.monotonic() + 60  # generous: not a bound on the broker
                            while publisher._driver.unconfirmed:
                                assert time.monotonic() < deadline
                                yield None  # "nothing yet": the publisher takes confirms in
                            assert close_connections(name) == 1
                            while publisher._link.is_open:  # until our side read the close
                                assert time.monotonic() < deadline
                                yield None
                        yield item

                return publisher.stream_items(cut())

        with pytest.raises(PublishError):
            publish_pending(publisher=CutAfter150())
        assert not [t for t in threading.enumerate() if t.name == "rmq-outbox-read-ahead"]
        assert OutboxMessage.objects.count() == 150  # the 150 confirmed ones are gone
        reset_publisher()
        assert publish_all().published == 150
    got = [p.message_id for _m, p, _b in rmq.get_all(rmq.queue("gamma"))]
    assert got == [r.message_id for r in results]
    assert OutboxMessage.objects.count() == 0


def test_a_relayed_message_carries_the_properties_a_direct_send_carries(rmq):
    """The relay publishes the properties the sender encoded (``wire_properties``), and rows
    written before that column (only the JSON copy) the same: a consumer cannot tell the
    three apart. Awkward values on purpose: bytes, NUL in text, nested tables, decimals."""
    import datetime
    import decimal

    call_command("rmq_consume", setup_only=True, verbosity=0)
    headers = {
        "tenant": "acme",
        "raw": b"\x00\xffbytes",
        "nul": "a\x00b",
        "nested": {"list": [1, "two", {"three": True}], "deep": {"x": None}},
        "when": datetime.datetime(2026, 11, 25, 10, 0, tzinfo=datetime.timezone.utc),
        "price": decimal.Decimal("12.34"),
        "big": 2**40,
    }
    props = {"correlation_id": "corr-1", "priority": 7, "type": "order.paid", "reply_to": "r"}
    conf = _conf(rmq, OUTBOX_PUBLISH_ON_COMMIT=False)
    with override_settings(RMQ_RETRY=conf):
        direct = other.send({"id": 0}, headers=headers, **props)
        with transaction.atomic():
            other.send({"id": 1}, outbox=True, headers=headers, **props)
            other.send({"id": 2}, outbox=True, headers=headers, **props)
        assert OutboxMessage.objects.filter(wire_properties__isnull=True).count() == 0
        old = OutboxMessage.objects.order_by("id").last()
        OutboxMessage.objects.filter(pk=old.pk).update(wire_properties=None)  # an older row
        assert publish_pending().published == 2
    got = rmq.get_all(rmq.queue("gamma"))
    assert [json.loads(body)["id"] for _m, _p, body in got] == [0, 1, 2]
    assert got[0][1].message_id == direct.message_id

    def seen(p):  # what differs by design: the id and the second it was sent
        return {k: v for k, v in vars(p).items() if k not in ("message_id", "timestamp")}

    assert seen(got[1][1]) == seen(got[0][1])
    assert seen(got[2][1]) == seen(got[0][1])
    assert got[0][1].headers["raw"] == b"\x00\xffbytes"  # the comparison is not vacuous
    assert got[1][1].headers["nested"]["list"][2] == {"three": True}
    assert all(p.message_id for _m, p, _b in got)
    assert OutboxMessage.objects.count() == 0


def test_a_header_amqp_cannot_carry_raises_at_the_send_and_writes_nothing(rmq):
    with transaction.atomic():
        with pytest.raises(Exception):  # noqa: B017 - whatever pika raises for the value
            other.send({"id": 1}, outbox=True, headers={"bad": object()})
        with pytest.raises(Exception):  # noqa: B017
            other.send({"id": 2}, outbox=True, message_id="x" * 300)  # AMQP: 255 bytes
        assert OutboxMessage.objects.count() == 0
