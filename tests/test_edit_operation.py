"""The edit page's requeue is a background operation, on the real broker: the request
publishes nothing, a consumer sends the edited copy (exactly once, the edit, never the
original), the row keeps the original and says who edited it; edit once while an edit
waits, and a cancelled edit frees the row for the next one."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.urls import reverse

from django_rmq_retry.models import (
    ItemState,
    OperationState,
    ParkedStatus,
    RequeueItem,
    RequeueOperation,
)
from django_rmq_retry.parking import operations
from tests.test_admin import operator
from tests.test_operations import handled_ids, park_rows, run_until_settled

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def submit(client, url: str, body: dict, headers: dict | None = None):
    data = {"body": json.dumps(body), "headers": json.dumps(headers or {}), "confirm": "1"}
    return client.post(url, data)


def errors(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_the_edit_post_publishes_nothing_and_a_consumer_sends_the_edit_once(rmq, client):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    (row,) = park_rows(rmq, [{"id": 7, "fail": "always"}])
    original = bytes(row.body)
    client.force_login(operator("edit_parkedmessage", username="editor"))
    url = reverse("admin:django_rmq_retry_parkedmessage_edit", args=[row.pk])

    response = submit(client, url, {"id": 7, "note": "fixed"}, {"tenant": "b"})

    assert response.status_code == 302, response.content[-3000:]
    ops = list(RequeueOperation.objects.all())
    assert len(ops) == 1, errors(client.get(response["Location"]))
    (op,) = ops
    page = reverse("admin:django_rmq_retry_requeueoperation_change", args=[op.pk])
    assert response["Location"] == page
    said = errors(client.get(page))
    assert said == [
        f"Operation #{op.pk} started: the edited copy will be requeued by the consumers, "
        "in the background; the original is kept."
    ], said
    assert rmq.depth(rmq.queue("alpha")) == 0  # the request published nothing
    row.refresh_from_db()
    assert row.status == ParkedStatus.PARKED
    assert not [e for e in row.history or [] if e.get("event") == "edited"]  # not sent yet
    (item,) = RequeueItem.objects.filter(operation=op)
    assert json.loads(bytes(item.edit_body)) == {"id": 7, "note": "fixed"}
    assert item.edit_headers == {"tenant": "b"}
    assert "Edited; operation" in LogEntry.objects.get(object_id=str(row.pk)).change_message

    op, out = run_until_settled(rmq, op, timeout=60)

    assert op.state == OperationState.DONE, (op.state_reason, out[-2000:])
    assert (op.sent, op.handled, op.failed_again) == (1, 1, 0)
    assert handled_ids(rmq) == Counter({7: 1})  # the edit (the original fails), once
    row.refresh_from_db()
    assert (row.status, row.requeue_count) == (ParkedStatus.REQUEUED, 1)
    assert bytes(row.body) == original  # the row keeps the original
    (edited,) = [e for e in row.history if e.get("event") == "edited"]
    assert edited["by"] == "editor" and '"fail": "always"' in edited["diff"]
    assert '"tenant": "b"' in edited["diff"]
    assert rmq.depth(rmq.queue("alpha")) == 0


def test_edit_once_while_an_edit_waits_and_a_cancelled_edit_frees_the_row(rmq, client):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    (row,) = park_rows(rmq, [{"id": 1}])
    client.force_login(operator("edit_parkedmessage", username="editor"))
    url = reverse("admin:django_rmq_retry_parkedmessage_edit", args=[row.pk])

    assert submit(client, url, {"id": 101}).status_code == 302
    (first,) = RequeueOperation.objects.all()
    # A second submit (a double click, a second operator) while the first edit waits.
    second = submit(client, url, {"id": 102})
    assert second.status_code == 200
    refusal = f"An edit of this message waits to be sent by operation #{first.pk} (running)"
    assert refusal in second.content.decode()
    assert RequeueOperation.objects.count() == 1 and RequeueItem.objects.count() == 1
    assert refusal in client.get(url).content.decode()  # the form says so before a submit

    # Cancelled, the first edit never goes out, and the row may be edited again.
    assert operations.cancel(first.pk, "editor")
    assert submit(client, url, {"id": 103}).status_code == 302
    third = RequeueOperation.objects.exclude(pk=first.pk).get()
    assert RequeueItem.objects.get(operation=first).state == ItemState.SKIPPED
    assert rmq.depth(rmq.queue("alpha")) == 0

    third, out = run_until_settled(rmq, third, timeout=60)

    assert third.state == OperationState.DONE, (third.state_reason, out[-2000:])
    assert handled_ids(rmq) == Counter({103: 1})  # only the last edit, once
    row.refresh_from_db()
    assert (row.status, row.requeue_count) == (ParkedStatus.REQUEUED, 1)
    assert [e["diff"].count("103") > 0 for e in row.history if e.get("event") == "edited"] == [True]
    # The row is requeued: no further edit.
    late = submit(client, url, {"id": 104})
    assert "Only a parked message can be edited and requeued." in late.content.decode()
    assert RequeueOperation.objects.count() == 2
