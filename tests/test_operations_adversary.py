"""Background requeues against an adversary, on the real broker with real processes: two
operators over one group, two edits of one row, and a table lock while copies are reported.

Each test counts at the receiver (its log) and in the database: every message once, the
state and the numbers the operators would read.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.urls import reverse

from django_rmq_retry.models import (
    OperationState,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from django_rmq_retry.parking import operations
from tests import waiting
from tests.conftest import ROOT, Child, all_ready, held_until, start_consumer, subprocess_env
from tests.test_admin import operator
from tests.test_operations import handled_ids, park_rows

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: Children that step operations: small batches, so two processes interleave their steps.
STEPPER_ENV = {"DJANGO_SETTINGS_MODULE": "tests.faults.op_settings", "RMQ_BATCH_SIZE": "20"}


def stepper(rmq, name: str, go: Path, **extra: str) -> Child:
    """``rmq_operations`` in a child that starts stepping when the file ``go`` appears."""
    code = held_until(
        go, "from django.core.management import call_command\ncall_command('rmq_operations')"
    )
    return Child(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        subprocess_env(rmq.prefix, rmq.log, **{**STEPPER_ENV, **extra}),
        rmq.log.with_name(f"{name}.out"),
    )


def stop(*children: Child | None) -> None:
    for child in children:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        if child is not None:
            child.communicate(timeout=60)


def steps_of(child: Child) -> int:
    found = re.search(r"Stopped after (\d+) step", child.output())
    assert found, child.output()[-2000:]
    return int(found.group(1))


def test_two_operators_over_one_group_two_processes_send_each_row_once(rmq, tmp_path):
    """Ann selects rows 0-199 and Bob rows 100-299 of one group; two ``rmq_operations``
    processes, released together, step both operations while a consumer (stepping nothing)
    handles the copies.

    Catches: a row of the overlap sent by both operations (claims not exclusive across
    operations), an operation that waits for ever on a row the other one sent, counters that
    do not add up (a row counted sent by both, or by neither).
    """
    rows = park_rows(rmq, [{"id": i} for i in range(300)])
    pks = [row.pk for row in rows]
    ann = operations.create(ParkedMessage.objects.filter(pk__in=pks[:200]), user="ann", rate=100)
    bob = operations.create(ParkedMessage.objects.filter(pk__in=pks[100:]), user="bob", rate=100)
    assert (ann.total, bob.total) == (200, 200)
    go = tmp_path / "go"
    consumer = start_consumer(rmq.prefix, rmq.log, "alpha", "--no-relay")
    first = second = None
    try:
        first, second = stepper(rmq, "first", go), stepper(rmq, "second", go)
        all_ready(go, 2)
        go.touch()
        waiting.until(
            "both operations ended",
            lambda: not RequeueOperation.objects.filter(state=OperationState.RUNNING).exists(),
            child=consumer,
            timeout=240,
        )
        waiting.until("300 copies handled", lambda: sum(handled_ids(rmq).values()) >= 300)
    finally:
        stop(first, second, consumer)
    ann.refresh_from_db()
    bob.refresh_from_db()
    assert (ann.state, bob.state) == (OperationState.DONE, OperationState.DONE), (
        ann.state_reason,
        bob.state_reason,
    )
    for op in (ann, bob):
        assert (op.sent + op.skipped, op.refused, op.unknown) == (200, 0, 0), op.state_reason
        assert op.handled == op.sent
    # The overlap went once: whichever operation sent a row, the other skipped it.
    assert (ann.sent + bob.sent, ann.skipped + bob.skipped) == (300, 100)
    assert handled_ids(rmq) == Counter(range(300))  # every message once
    assert set(ParkedMessage.objects.values_list("status", "requeue_count")) == {
        (ParkedStatus.REQUEUED, 1)
    }
    # Both processes stepped (the split is the race's, printed, not asserted).
    print(f"steps: first {steps_of(first)}, second {steps_of(second)}")


def row_story(row: ParkedMessage) -> list[Any]:
    """What the row says happened to it (for a failure's message)."""
    row.refresh_from_db()
    return [row.status, row.requeue_count, row.status_changed_by, row.history]


def test_two_edits_of_one_row_send_exactly_one_and_the_other_is_told(rmq):
    """Ann and Bob open the edit page of the same parked row, both see the form, and both
    submit at once (two sessions, two threads of requests).

    Catches: both edits sent (two copies of one message), the loser told that its edit
    went, a refusal that is a server error or says nothing, the loser's diff recorded in
    the row's history or the admin log.
    """
    call_command("rmq_consume", setup_only=True, verbosity=0)
    (row,) = park_rows(rmq, [{"id": 1}])
    url = reverse("admin:django_rmq_retry_parkedmessage_edit", args=[row.pk])
    change = reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk])
    edits = {"ann": 101, "bob": 102}  # each edit gives the body an id of its own
    clients = {}
    for who in edits:
        clients[who] = Client()
        clients[who].force_login(operator("edit_parkedmessage", username=who))
        form = clients[who].get(url)
        assert form.status_code == 200 and b'name="body"' in form.content
    barrier = threading.Barrier(len(edits))
    responses: dict[str, Any] = {}

    def submit(who: str) -> None:
        try:
            data = {"body": f'{{"id": {edits[who]}}}', "headers": "{}", "confirm": "1"}
            barrier.wait(timeout=30)
            responses[who] = clients[who].post(url, data)
        except Exception as exc:  # said by the assertion below, not lost in the thread
            responses[who] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit, args=(who,)) for who in edits]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert set(responses) == set(edits), responses
    assert not [r for r in responses.values() if isinstance(r, Exception)], responses
    # What each operator reads next, one after the other: the test client's ``context``
    # comes from a process-wide signal, so two requests at once would see each other's.
    said: dict[str, tuple[int, list[str]]] = {}
    for who, response in responses.items():
        if response.status_code == 302:
            followed = clients[who].get(response["Location"])
            texts = [str(m) for m in followed.context["messages"]]
        else:
            texts = re.findall(r'id="rmq-edit-error">([^<]+)<', response.content.decode())
        said[who] = (response.status_code, texts)
    winners = [
        who
        for who, (_code, texts) in said.items()
        if len(texts) == 1 and texts[0].startswith("Operation #") and "edited copy" in texts[0]
    ]
    depth = rmq.depth(rmq.queue("alpha"))
    assert len(winners) == 1, (said, f"{depth} copies in the queue", row_story(row))
    (winner,) = winners
    (loser,) = set(edits) - {winner}
    code, texts = said[loser]
    assert code in (200, 302), said  # a page, not a server error
    assert len(texts) == 1 and re.search(r"waits to be sent by operation #", texts[0]), said
    assert depth == 0  # the requests sent nothing
    (op,) = RequeueOperation.objects.all()
    assert operations.advance(op.pk) is not None  # one step sends the winning edit
    assert rmq.depth(rmq.queue("alpha")) == 1  # exactly one copy went out
    # The loser submits the page it still has open once more: refused, and said so.
    again = clients[loser].post(
        url, {"body": f'{{"id": {edits[loser]}}}', "headers": "{}", "confirm": "1"}
    )
    assert re.findall(r'id="rmq-edit-error">([^<]+)<', again.content.decode()) == [
        "Only a parked message can be edited and requeued."
    ]
    assert rmq.depth(rmq.queue("alpha")) == 1
    call_command("rmq_consume", "alpha", max_messages=1, verbosity=0)
    assert handled_ids(rmq) == Counter({edits[winner]: 1})  # the winning edit, once
    assert rmq.depth(rmq.queue("alpha")) == 0
    row.refresh_from_db()
    assert (row.status, row.requeue_count) == (ParkedStatus.REQUEUED, 1)
    history = [e for e in row.history if e.get("event") == "edited"]
    assert [e["by"] for e in history] == [winner]
    assert str(edits[winner]) in history[0]["diff"] and str(edits[loser]) not in history[0]["diff"]
    logged = LogEntry.objects.filter(object_id=str(row.pk))
    assert [entry.user.username for entry in logged] == [winner]
    assert clients[loser].get(change).status_code == 200


def _lock_holder() -> Any:
    """A second connection to the test database (not Django's: a transaction of its own)."""
    import psycopg

    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"] or "postgres",
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a table lock of PostgreSQL's")
@pytest.mark.parametrize("when", ["mid-operation", "all-sent"])
@pytest.mark.parametrize("reporter", ["relay", "no-relay"])
def test_a_lock_on_the_item_table_loses_no_report(rmq, tmp_path, reporter, when):
    """While another transaction holds an ``EXCLUSIVE`` lock on the operation's item table
    (reads go on, writes wait), the children's writes to it give up after 0.5 s
    (``lock_timeout``, as a production database may be set): the steps cannot fence or
    settle, the handled reports cannot be written. The receiver handles every copy already
    sent meanwhile; once the lock is gone, the operation ends with exact counts.

    ``mid-operation``: the lock comes once some copies are sent (steps fail on it too);
    ``all-sent``: once every copy is sent and settled, while the (slow) receiver still
    handles them, so after the lock nothing new happens that could carry a retry along.
    ``relay``: the consumer steps the operation and batches its reports (its operations
    thread); ``no-relay``: ``rmq_consume --no-relay`` writes each report at once and a
    separate ``rmq_operations`` steps it.

    Catches: reports dropped, or kept but never written again, after a database error
    (the operation then waits until the outcome timeout and counts them "unknown"); a
    failed fence or settle that sends a row twice or counts it wrong.
    """
    n = 200 if when == "mid-operation" else 60
    if when == "mid-operation":
        park_rows(rmq, [{"id": i} for i in range(n)])
        op = operations.create(ParkedMessage.objects.all(), user="ops", rate=100)
    else:
        park_rows(rmq, [{"id": i, "sleep": 0.05} for i in range(n)])
        op = operations.create(ParkedMessage.objects.all(), user="ops")
    s = connection.settings_dict
    url = (
        f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/"
        f"{s['NAME']}?options=-c%20lock_timeout%3D500"
    )
    env = {**STEPPER_ENV, "DATABASE_URL": url}
    go = tmp_path / "go"
    table = RequeueItem._meta.db_table
    holder = _lock_holder()
    consumer = step = None
    try:
        if reporter == "relay":
            consumer = start_consumer(rmq.prefix, rmq.log, "alpha", **env)
        else:
            consumer = start_consumer(rmq.prefix, rmq.log, "alpha", "--no-relay", **env)
            step = stepper(rmq, "stepper", go, **env)
            all_ready(go, 1)
            go.touch()
        least = 40 if when == "mid-operation" else n
        waiting.until(
            f"{least} copies sent",
            lambda: RequeueOperation.objects.get(pk=op.pk).sent >= least,
            child=consumer,
        )
        with holder.cursor() as cursor:
            cursor.execute(f'LOCK TABLE "{table}" IN EXCLUSIVE MODE')
        # No step settles more, no report is written now.
        sent, reported = RequeueOperation.objects.values_list("sent", "handled").get(pk=op.pk)
        if when == "all-sent":
            assert reported < n, "the receiver was not slow enough"
        waiting.until(
            f"the receiver handled the {sent} copies sent before the lock",
            lambda: sum(handled_ids(rmq).values()) >= sent,
            child=consumer,
        )
        if when == "all-sent":
            # Until the write of every report not written yet failed, the last one included.
            failed = f"could not write {n - reported} handled report(s)"
            waiting.until(failed, lambda: failed in consumer.output(), child=consumer)
        else:  # until a step failed on the lock (the reports may all be in already)
            stepping = consumer if step is None else step
            waiting.until(
                "a step failed on the lock",
                lambda: "lock timeout" in stepping.output(),
                child=stepping,
            )
        holder.commit()  # the lock is gone
        waiting.until(
            "the operation ended",
            lambda: RequeueOperation.objects.get(pk=op.pk).state != OperationState.RUNNING,
            child=consumer,
            timeout=240,
        )
    finally:
        holder.close()
        stop(step, consumer)
    op.refresh_from_db()
    assert (op.state, op.sent, op.handled, op.unknown, op.failed_again) == (
        OperationState.DONE,
        n,
        n,
        0,
        0,
    ), op.state_reason
    assert handled_ids(rmq) == Counter(range(n))  # every message once
    assert set(ParkedMessage.objects.values_list("status", "requeue_count")) == {
        (ParkedStatus.REQUEUED, 1)
    }
