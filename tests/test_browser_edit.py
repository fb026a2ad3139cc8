"""Edit a parked message and requeue the edited copy, in headless Chromium (Debian's
chromium through Playwright), then on the real broker: the submit lands on the operation
that carries the edit and sends nothing itself; a consumer sends exactly one copy (the
edit), the original row is kept, the edit is in the admin log and the row's history; bad
JSON and a body over the broker's limit are refused, a second submit while the edit waits
is refused; a user without the permission gets 403."""

from __future__ import annotations

import json
import signal

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse

from django_rmq_retry.models import ParkedMessage, ParkedStatus, RequeueItem, RequeueOperation
from django_rmq_retry.parking import operations
from tests.conftest import read_log, start_consumer
from tests.test_admin import operator
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operations import until_said
from tests.test_browser_operator import login, shots
from tests.test_operations import park_rows

pytestmark = [
    pytest.mark.browser,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def test_operator_edits_a_message_and_exactly_one_edited_copy_is_handled(
    rmq,
    live_server,
    browser,  # noqa: F811
    tmp_path,
):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    (row,) = park_rows(
        rmq, [{"id": 7, "fail": "always", "note": "<script>window.__pwned=1</script>"}]
    )
    original = bytes(row.body)
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{row.pk}/change/")
    page.click("#rmq-edit-one")
    page.wait_for_selector("#rmq-edit-form")
    assert page.inner_text("#rmq-edit-kind") == "json"
    assert page.evaluate("typeof window.__pwned") == "undefined"

    # Bad JSON: refused, nothing sent.
    page.fill("#rmq-edit-body", '{"id": 7,')
    page.click("#rmq-edit-preview")
    assert "not valid JSON" in page.inner_text("#rmq-edit-error")
    assert page.locator("#rmq-edit-confirm").count() == 0

    # The fix: no more "fail"; a header of the message's own added.
    page.fill("#rmq-edit-body", json.dumps({"id": 7, "note": "fixed"}))
    page.fill("#rmq-edit-headers", json.dumps({"tenant": "b"}))
    page.click("#rmq-edit-preview")
    diff = page.inner_text("#rmq-edit-diff")
    assert '"fail": "always"' in diff and '"tenant": "b"' in diff
    page.screenshot(path=str(shots(tmp_path) / "operator-edit-diff.png"), full_page=True)
    page.click("#rmq-edit-confirm")
    page.wait_for_selector("#rmq-progress")  # the operation that carries the edit
    op = RequeueOperation.objects.get()
    assert page.url == (
        f"{live_server.url}/admin/django_rmq_retry/requeueoperation/{op.pk}/change/"
    )
    assert f"Operation #{op.pk} started: the edited copy" in page.inner_text(".messagelist")
    assert rmq.depth(rmq.queue("alpha")) == 0  # the request sent nothing
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert f"Edited; operation #{op.pk} requeues one copy" in entry.change_message
    assert '"tenant": "b"' in entry.change_message

    child = start_consumer(rmq.prefix, rmq.log, "alpha")
    try:
        page.wait_for_selector("#rmq-progress[data-state=done]", timeout=120_000)
        until_said(page, "Done")
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)
    assert page.inner_text("[data-key=handled]") == "1"
    row.refresh_from_db()
    assert row.status == ParkedStatus.REQUEUED and bytes(row.body) == original
    assert row.history[-1]["event"] == "edited" and row.history[-1]["by"] == "ops"
    done = [e for e in read_log(rmq.log) if e["event"] == "done"]
    assert [e["id"] for e in done] == [7]  # once, and it went through: it was the edit
    assert rmq.depth(rmq.queue("alpha")) == 0  # one copy, the edit, not the original too
    assert not ParkedMessage.objects.filter(status=ParkedStatus.PARKED).exists()


def test_the_limits_the_double_post_and_the_permission(rmq, client, settings):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    row, other = park_rows(rmq, [{"id": 1}, {"id": 2}])
    url = reverse("admin:django_rmq_retry_parkedmessage_edit", args=[row.pk])
    client.force_login(operator("requeue_parkedmessage", username="requeuer"))
    assert client.get(url).status_code == 403
    page = client.get(reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk]))
    assert b"rmq-edit-one" not in page.content
    client.force_login(operator("edit_parkedmessage", username="editor"))
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "MAX_MESSAGE_BYTES": 64}
    big = client.post(
        url, {"body": json.dumps({"id": 1, "pad": "x" * 100}), "headers": "{}", "confirm": "1"}
    )
    assert "over the broker" in big.content.decode()
    assert rmq.depth(rmq.queue("alpha")) == 0
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "MAX_MESSAGE_BYTES": 1_000_000}
    data = {"body": '{"id": 1, "v": 2}', "headers": "{}", "confirm": "1"}
    first, second = client.post(url, data), client.post(url, data)  # a double click
    assert first.status_code == 302
    (op,) = RequeueOperation.objects.all()
    waits = f"An edit of this message waits to be sent by operation #{op.pk}"
    assert waits in second.content.decode()  # the second sends nothing
    assert waits in client.get(url).content.decode()
    assert RequeueItem.objects.count() == 1  # one copy to send, the first edit
    assert operations.advance(op.pk) is not None  # one step sends it (nobody handles it)
    assert rmq.depth(rmq.queue("alpha")) == 1  # exactly one copy
    assert "Only a parked message" in client.post(url, data).content.decode()
    assert rmq.depth(rmq.queue("alpha")) == 1
    other.refresh_from_db()
    assert other.status == ParkedStatus.PARKED
