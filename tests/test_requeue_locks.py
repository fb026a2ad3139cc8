"""A row of a requeue's selection held locked by another transaction (an editor's
``select_for_update``, a long transaction): neither the admin's request nor an operation's
step waits for it. The step leaves the row for the next one, and once the lock is gone the
operation sends every row, once.

PostgreSQL only: SQLite locks no rows (its one wait, for the database's write lock, is
bounded by the connection's ``timeout`` option).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.urls import reverse

from django_rmq_retry.models import (
    ItemState,
    OperationState,
    ParkedClaim,
    ParkedMessage,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from django_rmq_retry.parking import operations
from tests.conftest import wait_for
from tests.test_admin import operator, post_action
from tests.test_admin_requeue_background import run_until_settled
from tests.test_operations import handled_ids, park_rows
from tests.test_operations_state import once_confirmed

pytestmark = [
    pytest.mark.broker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
        reason="row locks: PostgreSQL only (SQLite locks the whole database, not rows)",
    ),
]

#: Generous: a step that waits for the lock never ends while the test holds it.
PATIENCE = 120


class Locker:
    """Another connection holding ``pk``'s row with ``SELECT ... FOR UPDATE`` until
    :meth:`release`."""

    def __init__(self, pk: int) -> None:
        self.pk = pk
        self.locked = threading.Event()
        self.go = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.locked.wait(PATIENCE)

    def _run(self) -> None:
        try:
            with transaction.atomic():
                list(ParkedMessage.objects.select_for_update().filter(pk=self.pk))
                self.locked.set()
                self.go.wait(PATIENCE * 2)
        finally:
            connections.close_all()

    def held(self) -> bool:
        return self.thread.is_alive() and not self.go.is_set()

    def release(self) -> None:
        self.go.set()
        self.thread.join(PATIENCE)


def returns_while(locker: Locker, call: Callable[[], Any]) -> Any:
    """Run ``call`` on a thread of its own; what it returned, asserting it returned while
    ``locker`` still held its row (the lock is released only after, whatever happens)."""
    out: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            out.append(call())
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        finished = done.wait(PATIENCE)
        assert finished, "it waited for the locked row"
        assert locker.held()
    finally:
        locker.release()
        thread.join(PATIENCE)
    return out[0] if out else None


def test_a_locked_row_delays_neither_the_click_nor_the_step_and_is_sent_once_after(rmq, client):
    n = 10
    rows = park_rows(rmq, [{"id": i} for i in range(n)])
    locked = rows[3]
    client.force_login(operator("requeue_parkedmessage"))
    locker = Locker(locked.pk)

    # The click, while the row is held: it only writes the operation.
    response = None
    try:
        response = post_action(client, "requeue_selected", [rows[0].pk], across=True)
        assert locker.held()
    finally:
        if response is None:
            locker.release()
    op = RequeueOperation.objects.get()
    assert op.total == n

    # A step while the row is held: it sends the others and leaves that one pending.
    returns_while(locker, lambda: operations.advance(op.pk, owner="stepper"))
    op.refresh_from_db()
    assert (op.sent, op.skipped, op.refused) == (n - 1, 0, 0)
    assert op.state_reason == (
        "1 message(s) held by another requeue or transaction: tried again at the next step."
    )
    item = RequeueItem.objects.get(operation=op, parked_id=locked.pk)
    assert item.state == ItemState.PENDING
    locked.refresh_from_db()
    assert (locked.status, locked.requeue_count) == (ParkedStatus.PARKED, 0)
    assert not ParkedClaim.objects.exists()
    assert rmq.depth(rmq.queue("alpha")) == n - 1

    # The lock is gone: a consumer steps the rest and handles every copy, once each.
    op = run_until_settled(rmq, op)
    assert op.state == OperationState.DONE, op.state_reason
    assert (op.sent, op.handled) == (n, n)
    assert handled_ids(rmq) == Counter(range(n))
    assert not ParkedMessage.objects.filter(status=ParkedStatus.PARKED).exists()


@contextmanager
def locked_once_confirmed(monkeypatch: pytest.MonkeyPatch, pk: int) -> Iterator[list[Locker]]:
    """Another transaction locks row ``pk`` once the broker confirmed the requeue's first
    batch, before the run marks it: the lock arrives after the claim."""
    lockers: list[Locker] = []
    once_confirmed(monkeypatch, lambda: lockers.append(Locker(pk)))
    try:
        yield lockers
    finally:
        for locker in lockers:
            locker.release()


def test_a_row_locked_between_claim_and_mark_is_left_to_its_outcome_and_sent_once(
    rmq, client, monkeypatch
):
    n = 6
    rows = park_rows(rmq, [{"id": i} for i in range(n)])
    locked = rows[2]
    client.force_login(operator("requeue_parkedmessage"))
    post_action(client, "requeue_selected", [rows[0].pk], across=True)
    op = RequeueOperation.objects.get()

    with locked_once_confirmed(monkeypatch, locked.pk) as lockers:
        # The step's mark meets the lock: it does not wait for it.
        stepped = threading.Event()

        def step() -> None:
            try:
                operations.advance(op.pk, owner="stepper")
            finally:
                connections.close_all()
                stepped.set()

        thread = threading.Thread(target=step)
        thread.start()
        assert stepped.wait(PATIENCE), "the step waited for the locked row"
        assert lockers and lockers[0].held()
        thread.join(PATIENCE)
        op.refresh_from_db()
        # Its copy is out (confirmed): counted sent, never sent again; the row is not
        # marked yet, and its claim keeps every other run off it.
        assert op.sent == n
        locked.refresh_from_db()
        assert locked.status == ParkedStatus.PARKED
        assert list(ParkedClaim.objects.values_list("parked_id", flat=True)) == [locked.pk]
        assert ParkedMessage.objects.filter(status=ParkedStatus.REQUEUED).count() == n - 1

    # The lock is gone; the consumer handles every copy once, and its report marks the row.
    op = run_until_settled(rmq, op)
    assert op.state == OperationState.DONE, op.state_reason
    assert (op.sent, op.handled) == (n, n)
    assert handled_ids(rmq) == Counter(range(n))
    locked.refresh_from_db()
    assert (locked.status, locked.requeue_count) == (ParkedStatus.REQUEUED, 1)
    page = client.get(reverse("admin:django_rmq_retry_requeueoperation_change", args=[op.pk]))
    assert page.status_code == 200


def someone_waits_for_a_lock() -> bool:
    """Whether a connection of this database waits for a lock another holds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def test_a_run_whose_copies_report_nothing_waits_for_its_marks_even_with_a_deadline(
    rmq, monkeypatch
):
    """Outside an operation nobody would mark a row whose copy is out: the mark waits for
    the lock (a deadline bounds the claims, not this), so the row is never sent twice."""
    import time

    from django_rmq_retry import parking

    n = 4
    rows = park_rows(rmq, [{"id": i} for i in range(n)])
    locked = rows[1]
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(
                parking.requeue(ParkedMessage.objects.all(), deadline=time.monotonic() + 600)
            )
        finally:
            connections.close_all()

    with locked_once_confirmed(monkeypatch, locked.pk) as lockers:
        thread = threading.Thread(target=run)
        thread.start()
        assert wait_for(someone_waits_for_a_lock, PATIENCE)  # the mark, on the held row
        assert lockers and lockers[0].held()
        lockers[0].release()
        thread.join(PATIENCE)
    (result,) = results
    assert result.requeued == n
    assert ParkedMessage.objects.filter(status=ParkedStatus.REQUEUED).count() == n
    assert not ParkedClaim.objects.exists()
    assert rmq.depth(rmq.queue("alpha")) == n


def test_a_handled_report_never_holds_the_receiver_on_a_locked_row(rmq):
    """Catches: a handled report written on the receiver's thread (no operations runner in
    the process) waiting for as long as another transaction holds a row it writes. A step
    frozen while it settled its batch held a consumer that way, every receiver of it idle.
    The report is handed to a thread of its own and lands once the lock is gone."""
    (row,) = park_rows(rmq, [{"id": 0}])
    op = operations.create(ParkedMessage.objects.all(), user="ops")
    RequeueItem.objects.filter(operation=op).update(state=ItemState.SENT)
    RequeueOperation.objects.filter(pk=op.pk).update(sent=1)
    operation_header = rmq.names.header(operations.HEADER)
    headers = {  # the copy's headers, as the step sent it: the row's first requeue
        operation_header: str(op.pk),
        rmq.names.header("parked-id"): row.pk,
        rmq.names.header("requeued"): 1,
    }
    assert not operations.flusher_running.is_set()
    locker = Locker(row.pk)  # the report marks that row requeued: it meets the lock
    returns_while(
        locker,
        lambda: operations.report_handled(headers, operation_header, rmq.names.header("parked-id")),
    )
    assert wait_for(
        lambda: RequeueItem.objects.get(operation=op).state == ItemState.HANDLED, timeout=PATIENCE
    ), "the report was not written once the lock was gone"
    op.refresh_from_db()
    assert (op.sent, op.handled) == (1, 1)
    row.refresh_from_db()
    assert (row.status, row.requeue_count) == (ParkedStatus.REQUEUED, 1)
