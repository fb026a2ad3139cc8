"""Parking and the requeue/discard/purge services (shared by the admin and the CLI)."""

from __future__ import annotations

import importlib
import json
import re
import threading
import time
from collections import Counter
from datetime import timedelta

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_rmq_retry import parking, signals
from django_rmq_retry.conf import current_names
from django_rmq_retry.core.errors import PublishError
from django_rmq_retry.core.names import Names
from django_rmq_retry.models import ParkedClaim, ParkedMessage, ParkedStatus
from django_rmq_retry.publishing.per_thread import get_publisher
from tests.conftest import BROKER_URL, ConfirmAll, read_log, wait_for
from tests.testapp.events import work

claims = importlib.import_module("django_rmq_retry.parking.claims")
marks = importlib.import_module("django_rmq_retry.parking.marks")

pytestmark = pytest.mark.django_db(transaction=True)


def _request(**overrides) -> parking.ParkRequest:
    values = dict(
        receiver="tests.testapp.consumers.alpha",
        queue="p.tests.testapp.consumers.alpha",
        exchange="p.work",
        routing_key="test.work",
        body=b'{"id": 1}',
        properties={"message_id": "m1", "content_type": "application/json", "headers": {"k": "v"}},
        reason="exhausted",
        reason_detail="failed 3 times",
        attempts=3,
        redelivered=False,
        error_type="ValueError",
        error_message="boom",
    )
    values.update(overrides)
    return parking.ParkRequest(**values)


def test_park_keys_of_rows_already_stored_do_not_change():
    # A changed key would make a redelivery of an already parked message park it twice.
    req = _request(
        queue="p.q",
        body=b'{"id": 1}',
        properties={"message_id": "m1", "headers": {"p-requeued": 2}},
        attempts=3,
        reason="exhausted",
    )
    assert parking.park_key(req, Names("p")) == (
        "0d7de9587eb068b8a49131592936ce2842924d8f3ee02b99e76e1a6a80451c89"
    )


def test_parking_the_same_delivery_twice_yields_one_row():
    row, created = parking.park(_request(), names=Names("p"))
    again, created_again = parking.park(_request(redelivered=True), names=Names("p"))
    assert created and not created_again and row.pk == again.pk
    assert ParkedMessage.objects.count() == 1
    assert ParkedMessage.objects.get().park_count == 1


def test_an_identical_new_message_is_counted_not_lost():
    parking.park(_request(), names=Names("p"))
    parking.park(_request(redelivered=False), names=Names("p"))
    assert ParkedMessage.objects.get().park_count == 2


def test_parked_row_keeps_the_message_bit_for_bit():
    body = bytes(range(256))
    props = {
        "message_id": "bin",
        "content_type": "application/octet-stream",
        "priority": 3,
        "correlation_id": "c",
        "timestamp": 1_700_000_000,
        "headers": {"b": b"\x00\xff", "n": 1},
    }
    row, _ = parking.park(_request(body=body, properties=props), names=Names("p"))
    row.refresh_from_db()
    assert bytes(row.body) == body and row.body_size == 256
    restored = parking.row_properties(row)
    assert restored["headers"] == {"b": b"\x00\xff", "n": 1}
    assert restored["priority"] == 3 and restored["correlation_id"] == "c"


def test_signals_fire_after_the_fact():
    seen = []

    def on_parked(sender, parked, reason, created, **kwargs):
        seen.append((sender, parked.pk, reason, created))

    signals.message_parked.connect(on_parked)
    try:
        row, _ = parking.park(_request(), names=Names("p"))
    finally:
        signals.message_parked.disconnect(on_parked)
    assert seen == [("tests.testapp.consumers.alpha", row.pk, "exhausted", True)]


def _batch(n: int, **overrides) -> list[parking.ParkRequest]:
    return [
        _request(body=b'{"id": %d}' % i, properties={"message_id": f"b{i}"}, **overrides)
        for i in range(n)
    ]


def test_park_many_writes_a_batch_in_order_with_one_commit():
    seen = []

    def on_parked(sender, parked, reason, created, **kwargs):
        seen.append(parked.pk)

    signals.message_parked.connect(on_parked)
    try:
        with CaptureQueriesContext(connection) as ctx:
            results = parking.park_many(_batch(5), names=Names("p"))
    finally:
        signals.message_parked.disconnect(on_parked)
    statements = [q["sql"].split()[0].upper() for q in ctx.captured_queries]
    assert statements.count("INSERT") == 1, statements  # one multi-row INSERT
    assert statements.count("COMMIT") <= 1, statements  # in one transaction
    assert [created for _pk, created in results] == [True] * 5
    rows = [ParkedMessage.objects.get(pk=pk) for pk, _ in results]
    assert [r.message_id for r in rows] == [f"b{i}" for i in range(5)]
    assert seen == [r.pk for r in rows]
    stored = {r.message_id: bytes(r.body) for r in ParkedMessage.objects.all()}
    assert stored == {f"b{i}": b'{"id": %d}' % i for i in range(5)}


def test_park_many_meeting_a_parked_delivery_keeps_one_row_each():
    # A redelivery after a lost ack: the batch hits an existing key, the rest still lands.
    parking.park(_batch(3)[1], names=Names("p"))
    results = parking.park_many(_batch(3, redelivered=True), names=Names("p"))
    assert [created for _pk, created in results] == [True, False, True]
    assert ParkedMessage.objects.count() == 3
    assert sorted(ParkedMessage.objects.values_list("park_count", flat=True)) == [1, 1, 1]


def test_park_many_counts_identical_new_messages_in_one_batch():
    results = parking.park_many([_request(), _request(), _request()], names=Names("p"))
    assert [created for _pk, created in results] == [True, False, False]
    assert ParkedMessage.objects.get().park_count == 3


def test_park_many_returns_a_requeued_message_to_its_row():
    row, _ = parking.park(_request(), names=Names("p"))
    ParkedMessage.objects.filter(pk=row.pk).update(status="requeued", requeue_count=1)
    back = _request(
        attempts=3,
        properties={"message_id": "m1", "headers": {"p-parked-id": str(row.pk), "p-requeued": 1}},
    )
    results = parking.park_many([back, *_batch(2)], names=Names("p"))
    assert results[0] == (row.pk, False)
    assert ParkedMessage.objects.count() == 3
    assert ParkedMessage.objects.get(pk=row.pk).park_count == 2


def test_values_postgresql_refuses_are_stored_exactly():
    # NUL characters and NaN floats: SQLite stores them, PostgreSQL refuses them in text and
    # JSON columns. A message carrying them must still be parked, and requeued as it came.
    headers = {"k\x00ey": "a\x00b", "nan": float("nan"), "inf": float("-inf"), "n": [1, "x\x00"]}
    props = {"message_id": "m\x00", "correlation_id": "c\x00", "headers": headers}
    row, _ = parking.park(
        _request(properties=props, error_message="bad \x00 byte", traceback="tb\x00"),
        names=Names("p"),
    )
    row = ParkedMessage.objects.get(pk=row.pk)
    restored = parking.row_properties(row)
    assert restored["message_id"] == "m\x00" and restored["correlation_id"] == "c\x00"
    back = restored["headers"]
    assert (
        back["k\x00ey"] == "a\x00b" and back["n"] == [1, "x\x00"] and back["inf"] == float("-inf")
    )
    assert back["nan"] != back["nan"]  # NaN
    assert row.message_id == "m\ufffd" and row.error_message == "bad \ufffd byte"


def _refuse_rows_whose_headers_contain(marker: str):
    """A database trigger that refuses the row: a real refusal by the real database."""
    table = ParkedMessage._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "CREATE FUNCTION rmqr_test_refuse() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.headers::text LIKE '%%{marker}%%' THEN "
                "RAISE EXCEPTION 'refused by a test trigger' USING ERRCODE = '22000'; END IF; "
                "RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cur.execute(
                f"CREATE TRIGGER rmqr_test_refuse BEFORE INSERT OR UPDATE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION rmqr_test_refuse()"
            )
        else:
            cur.execute(
                f"CREATE TRIGGER rmqr_test_refuse BEFORE INSERT ON {table} "
                f"WHEN NEW.headers LIKE '%{marker}%' "
                "BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
            )


def _drop_refusal() -> None:
    table = ParkedMessage._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(f"DROP TRIGGER IF EXISTS rmqr_test_refuse ON {table}")
            cur.execute("DROP FUNCTION IF EXISTS rmqr_test_refuse()")
        else:
            cur.execute("DROP TRIGGER IF EXISTS rmqr_test_refuse")


@pytest.mark.broker
def test_consumer_parks_messages_with_nul_characters_and_a_row_the_database_refuses(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    work.send({"id": 1, "reject": True}, headers={"x\x00": "a\x00b"}, message_id="nul\x00id")
    work.send({"id": 2, "reject": True}, headers={"note": "refuse-me"}, message_id="refused")
    work.send({"id": 3, "reject": True}, message_id="plain")
    _refuse_rows_whose_headers_contain("refuse-me")
    try:
        call_command("rmq_consume", "alpha", max_idle_time=2, verbosity=0)
    finally:
        _drop_refusal()
    rows = {r.message_id: r for r in ParkedMessage.objects.all()}
    assert set(rows) == {"nul\ufffdid", "refused", "plain"}  # all three parked, none held
    nul = parking.row_properties(rows["nul\ufffdid"])
    assert nul["message_id"] == "nul\x00id" and nul["headers"]["x\x00"] == "a\x00b"
    refused = rows["refused"]
    assert refused.headers == {} and bytes(refused.body) == b'{"id":2,"reject":true}'
    assert "stored without its headers" in refused.reason_detail
    assert (
        "refuse-me" in refused.reason_detail
        and "refused by a test trigger" in refused.reason_detail
    )
    assert rmq.depth(rmq.queue("alpha")) == 0


def _park_real_failures(rmq, n: int) -> None:
    """Messages that fail in alpha only (3 attempts in the test settings), then park."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(n):
        work.send({"id": i, "fail": 3, "only": ["alpha"]})
    # Three attempts in alpha and one in beta each: a count, not an idle window a retry's
    # delay could outlast on a loaded host (60 s of idle only ends a count that never comes).
    call_command("rmq_consume", "alpha", "beta", max_messages=4 * n, max_idle_time=60, verbosity=0)
    assert ParkedMessage.objects.filter(status="parked").count() == n


@pytest.mark.broker
def test_requeue_goes_back_to_the_failed_receiver_only_and_returns_to_its_row(rmq):
    _park_real_failures(rmq, 3)
    fingerprints = set(ParkedMessage.objects.values_list("fingerprint", flat=True))
    assert fingerprints == {"tests.testapp.consumers.Boom at tests/testapp/consumers.py:behave"}
    call_command(
        "rmq_requeue", receiver=["tests.testapp.consumers.alpha"], no_progress=True, verbosity=0
    )
    assert set(ParkedMessage.objects.values_list("status", flat=True)) == {"requeued"}
    assert rmq.depth(rmq.queue("alpha")) == 3 and rmq.depth(rmq.queue("beta")) == 0
    # attempts reset: alpha fails 3 more times (attempts 1-3 again) and parks into the SAME rows
    call_command("rmq_consume", "alpha", max_messages=9, max_idle_time=60, verbosity=0)
    rows = list(ParkedMessage.objects.all())
    assert len(rows) == 3
    assert {(r.status, r.park_count, r.requeue_count, r.attempts) for r in rows} == {
        ("parked", 2, 1, 3)
    }
    # parked, requeued (who: the command), parked again
    assert all([e["event"] for e in r.history] == ["parked", "requeued", "parked"] for r in rows)
    assert all(r.history[1]["by"] == "cli" for r in rows)
    alpha_starts = Counter(
        e["id"] for e in read_log(rmq.log) if e["event"] == "start" and e["receiver"] == "alpha"
    )
    beta_starts = Counter(
        e["id"] for e in read_log(rmq.log) if e["event"] == "start" and e["receiver"] == "beta"
    )
    assert alpha_starts == {0: 6, 1: 6, 2: 6} and beta_starts == {0: 1, 1: 1, 2: 1}


@pytest.mark.broker
def test_requeue_to_topic_reaches_every_receiver(rmq):
    _park_real_failures(rmq, 2)
    result = parking.requeue(ParkedMessage.objects.all(), user="op", mode=parking.MODE_TOPIC)
    assert result.requeued == 2
    assert rmq.depth(rmq.queue("alpha")) == 2 and rmq.depth(rmq.queue("beta")) == 2


@pytest.mark.broker
def test_a_requeue_with_a_deadline_takes_no_nack_pause_past_it(rmq, virtual_pauses):
    """The admin's click has a budget (``deadline``); a receiver queue that nacks (here a
    reject-publish policy, in life a cluster node stopping) used to hold the run for the
    pauses of ``PUBLISH_NACK_WAIT`` (20 s) past it. Now no pause ends after the deadline:
    the refused rows stay parked, counted as failed, and no claim is left."""
    from tests.test_adversary_consumer import rabbitmqctl

    _park_real_failures(rmq, 3)
    queue = rmq.queue("alpha")
    policy = f"{rmq.prefix}-refuse-requeue"
    probe = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    probing = probe.channel()
    probing.confirm_delivery()

    def refusing() -> bool:
        """A publish into the queue is nacked. Each accepted one stays: a quorum queue of
        RabbitMQ 4.0 takes one message past ``max-length`` 0 before it refuses."""
        try:
            probing.basic_publish("", queue, b"filler", mandatory=True)
        except pika.exceptions.NackError:
            return True
        return False

    rabbitmqctl(
        "set_policy", "--apply-to", "queues", "--priority", "100", policy,
        rf"^{re.escape(queue)}$", '{"max-length": 0, "overflow": "reject-publish"}',
    )  # fmt: skip
    try:
        assert wait_for(refusing, 60, 0.3)
        # On the pauses' own clock: 0.5 s fits in 1.2 s, the next (1 s) does not.
        deadline = virtual_pauses.now + 1.2
        result = parking.requeue(ParkedMessage.objects.all(), user="op", deadline=deadline)
    finally:
        rabbitmqctl("clear_policy", policy)
        probe.close()
    assert [seconds for _start, seconds in virtual_pauses.pauses] == [0.5]
    assert all(start + seconds <= deadline for start, seconds in virtual_pauses.pauses)
    assert (result.requeued, result.failed) == (0, 3)
    assert all("refused" in error for error in result.errors)
    assert set(ParkedMessage.objects.values_list("status", flat=True)) == {"parked"}
    assert not ParkedClaim.objects.exists()
    assert {body for _m, _p, body in rmq.get_all(queue)} <= {b"filler"}  # no copy got in


@pytest.mark.broker
def test_two_concurrent_requeues_never_publish_a_row_twice(rmq):
    _park_real_failures(rmq, 1)
    template = ParkedMessage.objects.get()
    copies = []
    for i in range(400):
        template.pk = None
        template.park_key = f"k{i}"
        copies.append(
            ParkedMessage(
                **{
                    f.attname: getattr(template, f.attname)
                    for f in ParkedMessage._meta.concrete_fields
                    if f.attname != "id"
                }
            )
        )
    ParkedMessage.objects.bulk_create(copies)
    total = ParkedMessage.objects.count()
    results = []
    barrier = threading.Barrier(2)

    def run():
        from django.db import connections

        from django_rmq_retry.publishing.publisher import Publisher

        try:
            barrier.wait()
            results.append(
                parking.requeue(
                    ParkedMessage.objects.all(), user="t", batch_size=50, publisher=Publisher()
                )
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.requeued for r in results) == total
    assert ParkedMessage.objects.filter(status="requeued").count() == total
    assert rmq.depth(rmq.queue("alpha")) == total  # each row published exactly once
    print(
        f"{connection.vendor}: requeued {[r.requeued for r in results]}, skipped {[r.skipped for r in results]}"
    )


class FailingAfter:
    """The real publisher, made to lose the broker after `n` messages (a broker that goes away):
    the rest of the batch gets no answer, and the stream raises as the real one does."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.real = get_publisher()

    def stream_batches(self, batches, answered, window=200, most=None, deadline=None):
        for batch in batches:
            if batch is None:
                continue
            ok_part, self.n = batch[: self.n], max(0, self.n - len(batch))
            if ok_part:
                self.real._answered(ok_part, window=window)
            answered(batch)
            if len(ok_part) < len(batch):
                raise PublishError("publish failed: connection lost (injected)")


@pytest.mark.broker
def test_interrupted_requeue_can_be_rerun_with_nothing_twice_and_nothing_skipped(rmq):
    _park_real_failures(rmq, 1)
    template = ParkedMessage.objects.get()
    ParkedMessage.objects.bulk_create(
        [
            ParkedMessage(
                **{
                    **{
                        f.attname: getattr(template, f.attname)
                        for f in ParkedMessage._meta.concrete_fields
                        if f.attname != "id"
                    },
                    "park_key": f"k{i}",
                }
            )
            for i in range(99)
        ]
    )
    with pytest.raises(PublishError) as info:
        parking.requeue(ParkedMessage.objects.all(), batch_size=30, publisher=FailingAfter(45))
    assert isinstance(info.value, parking.RequeueInterrupted)
    assert info.value.partial.requeued == 45  # what the run did before the broker went away
    assert ParkedMessage.objects.filter(status="requeued").count() == 45
    assert ParkedMessage.objects.filter(status="parked").count() == 55  # claims released
    result = parking.requeue(ParkedMessage.objects.all(), batch_size=30)
    assert result.requeued == 55
    assert rmq.depth(rmq.queue("alpha")) == 100


@pytest.mark.broker
def test_cli_filters_dry_run_and_limit(rmq, capsys):
    _park_real_failures(rmq, 4)
    call_command("rmq_requeue", dry_run=True, receiver=["tests.testapp.consumers.alpha"])
    assert "4 parked message(s) would be requeued" in capsys.readouterr().out
    call_command("rmq_requeue", limit=3, no_progress=True)
    assert ParkedMessage.objects.filter(status="requeued").count() == 3
    call_command("rmq_requeue", error_type=["KeyError"], no_progress=True)
    assert ParkedMessage.objects.filter(status="parked").count() == 1
    ids = str(ParkedMessage.objects.get(status="parked").pk)
    call_command("rmq_requeue", ids=[ids], since="1h", no_progress=True)
    assert ParkedMessage.objects.filter(status="parked").count() == 0
    with pytest.raises(CommandError, match="cannot read time"):
        call_command("rmq_requeue", since="yesterday-ish")


def test_discard_and_purge():
    for i in range(5):
        parking.park(_request(body=f"{i}".encode()), names=Names("p"))
    assert (
        parking.discard(
            ParkedMessage.objects.filter(body_size=1)[:0] or ParkedMessage.objects.all(), user="op"
        )
        == 5
    )
    assert parking.discard(ParkedMessage.objects.all()) == 0  # already discarded
    ParkedMessage.objects.update(parked_at=timezone.now() - timedelta(days=40))
    parking.park(_request(body=b"fresh"), names=Names("p"))
    call_command("rmq_purge_parked", older_than="30d", verbosity=0)
    assert list(ParkedMessage.objects.values_list("status", flat=True)) == ["parked"]
    with pytest.raises(CommandError, match="cannot read duration"):
        call_command("rmq_purge_parked", older_than="a while")


def test_failure_groups_ignore_the_message_text():
    from django_rmq_retry.core.failure import fingerprint, frames_of, library_roots

    def find(order_id):
        raise LookupError(f"order {order_id} not found")

    prints = set()
    for oid in (17, 18):
        try:
            find(oid)
        except LookupError as exc:
            prints.add(
                fingerprint(
                    "LookupError", frames_of(exc.__traceback__), library_roots(), "/work/main"
                )
            )
    assert len(prints) == 1
    assert prints.pop().endswith(":find")


def test_summary_groups_by_receiver_and_failure_group():
    for i in range(3):
        parking.park(
            _request(body=f"{i}".encode(), fingerprint="ValueError at a.py:f"), names=Names("p")
        )
    parking.park(
        _request(body=b"x", fingerprint="KeyError at b.py:g", error_type="KeyError"),
        names=Names("p"),
    )
    groups = parking.summary()
    assert [(g["fingerprint"], g["count"]) for g in groups] == [
        ("ValueError at a.py:f", 3),
        ("KeyError at b.py:g", 1),
    ]


# Claims (a requeue run's hold on the rows it publishes) ------------------------------------
def _claim(row: ParkedMessage, *, age: float = 0.0, token: str = "other-run") -> None:
    ParkedClaim.objects.create(
        parked_id=row.pk, token=token, claimed_at=timezone.now() - timedelta(seconds=age)
    )


def test_a_requeue_waits_for_its_next_chunk_without_spinning():
    """Outside a transaction the next chunk loads on a thread of its own; a publisher that
    answers at once (the in-memory broker's) gets "nothing yet" meanwhile. Each of those
    must wait a moment: returned at once, they spun on the interpreter lock the loading
    thread needs (a requeue of 20,000 rows took 23 s with 22 million of them, 0.8 s with
    ~300)."""
    parking.park_many(_batch(600), names=Names("p"))
    publisher = ConfirmAll()
    result = parking.requeue(ParkedMessage.objects.all(), publisher=publisher, batch_size=100)
    assert result.requeued == 600 and len(publisher.sent) == 600
    # Six chunks of 100 rows: a few waits of POLL_WAIT each, not a busy loop.
    assert publisher.waits < 6 * 2_000


def test_a_row_another_run_holds_is_left_to_it_until_its_claim_is_stale():
    held, free = (parking.park(r, names=Names("p"))[0] for r in _batch(2))
    _claim(held)
    publisher = ConfirmAll()
    result = parking.requeue(ParkedMessage.objects.all(), publisher=publisher)
    assert (result.requeued, result.skipped) == (1, 1)
    assert [m[3]["message_id"] for m in publisher.sent] == [free.message_id]
    assert ParkedMessage.objects.get(pk=held.pk).status == ParkedStatus.PARKED
    assert list(ParkedClaim.objects.values_list("parked_id", "token")) == [(held.pk, "other-run")]
    # The other run was killed: once its claim is older than REQUEUE_CLAIM_TIMEOUT, the
    # next run deletes it and publishes the row.
    ParkedClaim.objects.update(claimed_at=timezone.now() - timedelta(seconds=301))
    result = parking.requeue(ParkedMessage.objects.all(), publisher=publisher)
    assert result.requeued == 1 and ParkedMessage.objects.get(pk=held.pk).status == "requeued"
    assert not ParkedClaim.objects.exists()  # every claim let go at the end of a run


def test_discard_and_purge_leave_a_row_a_requeue_is_publishing():
    held, _free = (parking.park(r, names=Names("p"))[0] for r in _batch(2))
    _claim(held)
    assert parking.discard(ParkedMessage.objects.all()) == 1
    ParkedMessage.objects.update(parked_at=timezone.now() - timedelta(days=40))
    statuses = [ParkedStatus.PARKED, ParkedStatus.REQUEUED, ParkedStatus.DISCARDED]
    assert parking.purge(timedelta(days=30), statuses=statuses) == 1  # the discarded one
    assert list(ParkedMessage.objects.values_list("pk", "status")) == [(held.pk, "parked")]
    # The run is gone: once its claim is older than REQUEUE_CLAIM_TIMEOUT, the row is free.
    ParkedClaim.objects.update(claimed_at=timezone.now() - timedelta(seconds=301))
    assert parking.discard(ParkedMessage.objects.all()) == 1


def test_a_late_mark_leaves_a_row_its_failed_copy_parked_again():
    """The copy of a requeue fails and parks before the run marks its row: the row is parked
    (requeue counted once), and the run's mark, arriving after, changes nothing."""
    names = current_names()
    row, _ = parking.park(_request(), names=names)
    _claim(row, token="run")
    stored = claims.Stored(row.pk, b"", {}, {}, row.queue, "", "", 0)
    headers = {names.header("parked-id"): str(row.pk), names.header("requeued"): 1}
    back, created = parking.park(
        _request(attempts=1, properties={"message_id": "m1", "headers": headers}), names=names
    )
    assert (back.pk, created) == (row.pk, False)
    result = parking.RequeueResult()
    marks.mark_requeued([stored], "run", "", "receiver", "default", result)
    row.refresh_from_db()
    assert (row.status, row.requeue_count, row.park_count) == ("parked", 1, 2)


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="a race between two connections' row locks (SQLite writes one at a time)",
)
def test_a_mark_that_waited_for_the_copy_s_parking_leaves_the_row_parked():
    """Same as above, but the mark's UPDATE starts while the parking holds the row: it waits,
    then finds the row changed. PostgreSQL checks the row's own columns again on its newest
    version, not the claim (read from the statement's snapshot): the requeue count decides."""
    names = current_names()
    row, _ = parking.park(_request(), names=names)
    _claim(row, token="run")
    stored = claims.Stored(row.pk, b"", {}, {}, row.queue, "", "", 0)
    headers = {names.header("parked-id"): str(row.pk), names.header("requeued"): 1}
    locked, go = threading.Event(), threading.Event()

    def parking_thread() -> None:
        from django.db import connections, transaction

        try:
            with transaction.atomic():
                ParkedMessage.objects.select_for_update().get(pk=row.pk)
                locked.set()
                go.wait(10)
                parking.park(
                    _request(attempts=1, properties={"message_id": "m1", "headers": headers}),
                    names=names,
                )
        finally:
            connections.close_all()

    t = threading.Thread(target=parking_thread)
    t.start()
    assert locked.wait(10)
    threading.Timer(1.0, go.set).start()  # the mark below is waiting on the row by then
    result = parking.RequeueResult()
    marks.mark_requeued([stored], "run", "", "receiver", "default", result)
    t.join()
    row.refresh_from_db()
    assert (row.status, row.requeue_count, row.park_count) == ("parked", 1, 2)


# A flood of parks widens the window ----------------------------------------------------------
class _WritesHeld:
    """Another connection holding the parked table's writes (SQLite: its write lock;
    PostgreSQL: a table lock), as a long transaction or a migration would."""

    def __enter__(self) -> _WritesHeld:
        if connection.vendor == "sqlite":
            import sqlite3

            self._conn = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
            self._conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg

            s = connection.settings_dict
            self._conn = psycopg.connect(
                dbname=s["NAME"], user=s["USER"], host=s["HOST"], port=s["PORT"] or 5432
            )
            self._conn.execute(f"LOCK TABLE {ParkedMessage._meta.db_table} IN EXCLUSIVE MODE")
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.rollback()
        self._conn.close()


@pytest.mark.broker
def test_rows_waiting_for_their_commit_widen_the_window_with_a_spare_consumer(
    rmq, monkeypatch, tmp_path
):
    """Prefetch 2 and SPARE_PREFETCH 8 (opted in), 30 messages rejected (parked at once)
    while another connection holds the table's writes: the two in the window wait for their
    commit, so the consumer opens a spare consumer (prefetch 8) and takes ten; once the writes go through, every message is
    parked exactly once, the receiver ran once for each, and the spare leaves. Without the
    spare a flood parks one window per commit (bench/README, "Parking is bound per batch")."""
    from django_rmq_retry.consumer import Consumer
    from django_rmq_retry.consumer.spare import SPARE_LINGER_S
    from django_rmq_retry.registry import default_registry

    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv("RMQ_TEST_LOG", str(log))
    call_command("rmq_consume", setup_only=True, verbosity=0)
    alpha = default_registry.find("alpha", rmq.names.prefix)
    assert alpha is not None
    queue = alpha.queue_name(rmq.names.prefix)
    for i in range(30):
        work.send({"id": i, "reject": True, "only": ["alpha"]})
    assert wait_for(lambda: rmq.depth(queue) == 30, 60)
    window = 2 + 8
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "SPARE_PREFETCH": 8}):
        consumer = Consumer([alpha], consume_orphans=False, prefetch=2)
    thread = threading.Thread(target=consumer.run)
    with _WritesHeld():
        thread.start()
        try:
            assert wait_for(lambda: consumer._parking[queue] == window, 20), consumer._parking
            assert rmq.consumers(queue) == 2 and rmq.depth(queue) == 30 - window
            time.sleep(0.5)  # nothing more taken while the rows wait: the window is full
            assert consumer._parking[queue] == window
        except BaseException:
            consumer.request_stop()
            raise
    try:
        assert wait_for(lambda: ParkedMessage.objects.count() == 30, 60)
        assert wait_for(lambda: rmq.consumers(queue) == 1, SPARE_LINGER_S + 10)
        assert not consumer._spares.tags and not consumer._parking
    finally:
        consumer.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert consumer.stats.parked == 30
    ids = sorted(json.loads(bytes(row.body))["id"] for row in ParkedMessage.objects.all())
    assert ids == list(range(30))
    starts = Counter(e["id"] for e in read_log(log) if e["event"] == "start")
    assert starts == Counter(range(30))  # each receiver ran once: nothing given back and run again
    assert rmq.depth(queue) == 0
