"""Every requeue the admin offers starts a background operation: the web request publishes
nothing, and the consumers send each selected message once.

The check that the request published nothing is the target queue's depth right after the
response, with no consumer running: a requeue done inside the request would have put every
copy there (confirmed before the response). Then a consumer process steps the operation on
its housekeeping thread and handles the copies: each message is handled exactly once.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from django_rmq_retry.models import OperationState, ParkedMessage, ParkedStatus, RequeueOperation
from tests.conftest import read_log, start_consumer, wait_for
from tests.test_admin import operator, post_action, texts
from tests.test_operations import handled_ids, park_rows

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def operation_url(op: RequeueOperation) -> str:
    return reverse("admin:django_rmq_retry_requeueoperation_change", args=[op.pk])


def run_until_settled(
    rmq, op: RequeueOperation, receivers: tuple[str, ...] = ("alpha",)
) -> RequeueOperation:
    """A consumer process of ``receivers`` steps ``op`` (its housekeeping thread) and
    handles the copies, until the operation is no longer running."""
    child = start_consumer(rmq.prefix, rmq.log, *receivers)
    try:
        settled = wait_for(
            lambda: RequeueOperation.objects.get(pk=op.pk).state != OperationState.RUNNING,
            timeout=120,
            interval=0.2,
        )
    finally:
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    op.refresh_from_db()
    assert settled, (op.state, op.state_reason, out[-2000:])
    return op


def nothing_sent_yet(rmq, rows: list[ParkedMessage]) -> None:
    """The request published nothing and marked nothing."""
    assert rmq.depth(rmq.queue("alpha")) == 0
    assert rmq.depth(rmq.queue("beta")) == 0
    statuses = set(
        ParkedMessage.objects.filter(pk__in=[r.pk for r in rows]).values_list("status", flat=True)
    )
    assert statuses == {ParkedStatus.PARKED}


def test_requeue_selected_sends_nothing_in_the_request_and_each_message_once_after(rmq, client):
    n = 30
    rows = park_rows(rmq, [{"id": i} for i in range(n)])
    client.force_login(operator("requeue_parkedmessage"))

    response = post_action(client, "requeue_selected", [rows[0].pk], across=True)

    nothing_sent_yet(rmq, rows)
    op = RequeueOperation.objects.get()
    assert response.redirect_chain == [(operation_url(op), 302)]
    assert (op.mode, op.total, op.sent, op.state) == ("receiver", n, 0, OperationState.RUNNING)
    assert (op.canary, op.ramp, op.rate, op.stop_on_failure) == (0, False, None, False)
    assert texts(response) == [
        (
            "success",
            f"Operation #{op.pk} started: {n} messages will be requeued to the receivers "
            "they failed in by the consumers, in the background.",
        )
    ]
    entry = LogEntry.objects.get()
    assert entry.change_message.startswith(f"Started requeue operation #{op.pk} ({n} rows).")
    assert "all rows matching the filter" in entry.change_message

    op = run_until_settled(rmq, op)
    assert op.state == OperationState.DONE, op.state_reason
    assert (op.sent, op.handled, op.failed_again, op.unknown) == (n, n, 0, 0)
    assert handled_ids(rmq) == Counter(range(n))  # each message once
    assert not ParkedMessage.objects.filter(status=ParkedStatus.PARKED).exists()


def test_republish_to_topic_is_an_operation_that_reaches_every_receiver_once(rmq, client):
    n = 5
    rows = park_rows(rmq, [{"id": i} for i in range(n)])
    client.force_login(operator("requeue_parkedmessage"))
    ask = post_action(client, "republish_to_topic", [r.pk for r in rows])
    assert "Republish to ALL receivers of the topic?" in ask.content.decode()
    assert not RequeueOperation.objects.exists()  # asking starts nothing

    response = post_action(client, "republish_to_topic", [r.pk for r in rows], confirm="yes")

    nothing_sent_yet(rmq, rows)
    op = RequeueOperation.objects.get()
    assert response.redirect_chain == [(operation_url(op), 302)]
    assert (op.mode, op.total) == ("topic", n)
    assert texts(response)[0][1].startswith(
        f"Operation #{op.pk} started: {n} messages will be republished to ALL receivers"
    )
    assert "republish to ALL receivers of the topic" in LogEntry.objects.get().change_message

    op = run_until_settled(rmq, op, ("alpha", "beta"))
    assert op.state == OperationState.DONE, op.state_reason
    done = Counter((e["receiver"], e["id"]) for e in read_log(rmq.log) if e["event"] == "done")
    assert done == Counter((name, i) for name in ("alpha", "beta") for i in range(n))
    assert not ParkedMessage.objects.filter(status=ParkedStatus.PARKED).exists()


def test_the_detail_pages_requeue_starts_an_operation_of_that_row_and_shows_it(rmq, client):
    rows = park_rows(rmq, [{"id": i} for i in range(3)])
    row = rows[1]
    client.force_login(operator("requeue_parkedmessage"))
    url = reverse("admin:django_rmq_retry_parkedmessage_requeue_one", args=[row.pk])

    response = client.post(url, follow=True)

    nothing_sent_yet(rmq, rows)
    op = RequeueOperation.objects.get()
    assert response.redirect_chain == [(operation_url(op), 302)]
    assert list(op.items.values_list("parked_id", flat=True)) == [row.pk]
    assert texts(response) == [
        (
            "success",
            f"Operation #{op.pk} started: 1 message will be requeued to the receiver it "
            "failed in by the consumers, in the background.",
        )
    ]
    assert LogEntry.objects.get().object_id == str(row.pk)

    op = run_until_settled(rmq, op)
    assert op.state == OperationState.DONE, op.state_reason
    assert handled_ids(rmq) == Counter([1])
    row.refresh_from_db()
    assert row.status == ParkedStatus.REQUEUED
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 2

    # A second click on the row (requeued now) starts an operation with nothing to send.
    again = client.post(url, follow=True)
    second = RequeueOperation.objects.latest("pk")
    assert second.pk != op.pk
    assert (second.total, second.state) == (0, OperationState.DONE)
    assert again.redirect_chain == [(operation_url(second), 302)]
    assert texts(again) == [
        (
            "warning",
            f"Operation #{second.pk}: nothing to requeue, none of the selected messages is parked.",
        )
    ]


def test_requeue_needs_its_permission_and_a_forged_post_starts_nothing(rmq, client):
    (row,) = park_rows(rmq, [{"id": 1}])
    client.force_login(operator())  # may view, may not requeue
    post_action(client, "requeue_selected", [row.pk])
    post_action(client, "republish_to_topic", [row.pk], confirm="yes")
    url = reverse("admin:django_rmq_retry_parkedmessage_requeue_one", args=[row.pk])
    assert client.post(url).status_code == 403
    assert not RequeueOperation.objects.exists()
    row.refresh_from_db()
    assert row.status == ParkedStatus.PARKED
