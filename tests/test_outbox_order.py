"""A transaction's order across relays, at any size (real broker and database).

Three ``rmq_relay`` processes share the outbox at their default round size while it holds
two transactions of thousands of rows each, beside small ones: every row is published once
(no process is killed, so no duplicate is allowed), none is lost, and the rows of each
(transaction, topic) reach the queue in the order they were written.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings

from django_rmq_retry.models import OutboxMessage
from django_rmq_retry.outbox import publish_pending
from django_rmq_retry.outbox.drain import publish_all
from tests.conftest import ROOT, Child, all_ready, held_until, subprocess_env
from tests.testapp.events import other

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

BIG = (6000, 5000)
SMALL = 40  # ten-row transactions beside the big ones
RELAYS = 3


def inversions(order: list[int]) -> int:
    """Rows that arrived after a row written later than them (0 when in order)."""
    highest, count = -1, 0
    for i in order:
        if i < highest:
            count += 1
        highest = max(highest, i)
    return count


def test_three_relays_keep_the_order_of_transactions_of_thousands_of_rows(rmq, tmp_path):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    written: dict[str, int] = {}
    with override_settings(
        RMQ_RETRY={**settings.RMQ_RETRY, "PREFIX": rmq.prefix, "OUTBOX_PUBLISH_ON_COMMIT": False}
    ):
        for t, size in enumerate(BIG):
            with transaction.atomic():
                other.send_many([{"t": f"big{t}", "i": i} for i in range(size)], outbox=True)
            written[f"big{t}"] = size
            for s in range(SMALL // 2):
                with transaction.atomic():
                    other.send_many([{"t": f"s{t}.{s}", "i": i} for i in range(10)], outbox=True)
                written[f"s{t}.{s}"] = 10
    total = sum(written.values())
    assert OutboxMessage.objects.count() == total
    connection.close()  # SQLite: let the children write
    env = subprocess_env(rmq.prefix, rmq.log)
    go = tmp_path / "go"  # the relays start together once all three are up
    starter = held_until(
        go, "from django.core.management import call_command\ncall_command('rmq_relay', once=True)"
    )
    children = [
        Child(
            [sys.executable, str(ROOT / "manage.py"), "shell", "-c", starter],
            env,
            tmp_path / f"relay-{uuid.uuid4().hex[:8]}.out",
        )
        for _ in range(RELAYS)
    ]
    try:
        all_ready(go, RELAYS)
        go.write_text("go")
        started = time.monotonic()
        published = []
        for child in children:
            out, _ = child.communicate(timeout=300)
            assert child.returncode == 0, out
            published.append(int(out.split("Stopped: ")[1].split(" published")[0]))
        took = time.monotonic() - started
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    got = [json.loads(body) for _m, _p, body in rmq.get_all(rmq.queue("gamma"))]
    by_transaction: dict[str, list[int]] = {}
    for body in got:
        by_transaction.setdefault(body["t"], []).append(body["i"])
    duplicates = len(got) - len({(b["t"], b["i"]) for b in got})
    lost = sum(size - len(set(by_transaction.get(t, []))) for t, size in written.items())
    inverted = {t: inversions(order) for t, order in by_transaction.items()}
    print(
        f"\n{connection.vendor}: published per relay {published}, received {len(got)} of "
        f"{total}, duplicates {duplicates}, lost {lost}, inversions {sum(inverted.values())} "
        f"(big: {[inverted.get(f'big{t}') for t in range(len(BIG))]}), relays done in {took:.1f} s"
    )
    assert (duplicates, lost, sum(inverted.values())) == (0, 0, 0)
    assert sum(published) == total
    assert OutboxMessage.objects.count() == 0


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="row locks between relays: PostgreSQL (SQLite relays take the database's write lock)",
)
@pytest.mark.parametrize("how", ["round", "drain"])
def test_a_round_stops_before_a_stretch_of_its_transaction_another_relay_holds(rmq, how):
    """One transaction of 1,000 rows; another relay's round holds rows 300-399 (it locked
    them while this round was reading, and leaves them, waiting for the rows before). A
    round publishes rows 0-299 and stops there; a drain does too,
    then goes on once the other round ends: all 1,000 in order, once each."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    conf = {**settings.RMQ_RETRY, "PREFIX": rmq.prefix, "OUTBOX_PUBLISH_ON_COMMIT": False}
    with override_settings(RMQ_RETRY=conf):
        with transaction.atomic():
            other.send_many([{"t": "big", "i": i} for i in range(1000)], outbox=True)
        ids = list(OutboxMessage.objects.order_by("id").values_list("id", flat=True))
        locked, release = threading.Event(), threading.Event()

        def other_relay() -> None:
            try:
                with transaction.atomic():
                    list(OutboxMessage.objects.select_for_update().filter(id__in=ids[300:400]))
                    locked.set()
                    release.wait(30)
            finally:
                connections.close_all()

        t = threading.Thread(target=other_relay)
        t.start()
        assert locked.wait(10)
        got: list[int] = []
        try:
            if how == "round":
                done = publish_pending()
                got = [json.loads(b)["i"] for _m, _p, b in rmq.get_all(rmq.queue("gamma"))]
                assert got == list(range(300)), (done, got[:5], len(got))
                assert done.waiting == 600  # rows 400-999: a drain looks again from the oldest
            else:  # the drain goes on until the other round ends (here after 2 s)
                threading.Timer(2.0, release.set).start()
                publish_all()
        finally:
            release.set()
            t.join()
        publish_all()
        got += [json.loads(b)["i"] for _m, _p, b in rmq.get_all(rmq.queue("gamma"))]
        assert got == list(range(1000))
        assert OutboxMessage.objects.count() == 0
