"""The parked-message and retry-policy admin, driven through Django's test client.

Actions publish to the real broker (the ``rmq`` fixture gives each test its own prefix).
"""

from __future__ import annotations

import gzip
import json
import re
import time
import tracemalloc
import uuid
import zlib

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from django_rmq_retry.admin import ParkedMessageAdmin
from django_rmq_retry.admin.preview import body_preview, hex_dump
from django_rmq_retry.models import (
    OperationState,
    ParkedClaim,
    ParkedMessage,
    ParkedStatus,
    RequeueOperation,
    RetryPolicy,
)
from django_rmq_retry.parking import operations
from tests.conftest import wait_for
from tests.testapp.events import work

ALPHA = "tests.testapp.consumers.alpha"
CHANGELIST = "admin:django_rmq_retry_parkedmessage_changelist"


def changelist_url(**query: str) -> str:
    from urllib.parse import urlencode

    url = reverse(CHANGELIST)
    return f"{url}?{urlencode(query)}" if query else url


def make_row(
    *, queue: str = "rmq_retry_test.tests.testapp.consumers.alpha", **fields
) -> ParkedMessage:
    now = timezone.now()
    values = {
        "park_key": uuid.uuid4().hex,
        "receiver": ALPHA,
        "queue": queue,
        "exchange": "rmq_retry_test.work",
        "routing_key": "test.work",
        "message_id": uuid.uuid4().hex,
        "body": b'{"id": 1}',
        "content_type": "application/json",
        "properties": {"content_type": "application/json", "delivery_mode": 2},
        "headers": {},
        "reason": "exhausted",
        "error_type": "tests.testapp.consumers.Boom",
        "error_message": "boom 1 attempt 3",
        "fingerprint": "tests.testapp.consumers.Boom@tests/testapp/consumers.py:behave",
        "attempts": 3,
        "parked_at": now,
    }
    values.update(fields)
    values["body_size"] = len(values["body"])
    return ParkedMessage.objects.create(**values)


def rows_for(rmq, n: int, body: bytes = b'{"id": 1}') -> list[ParkedMessage]:
    """``n`` rows parked from alpha's real queue in this test's broker slice."""
    queue = rmq.queue("alpha")
    now = timezone.now()
    objs = [
        ParkedMessage(
            park_key=uuid.uuid4().hex,
            receiver=ALPHA,
            queue=queue,
            exchange=rmq.names.work_exchange,
            routing_key="test.work",
            message_id=f"m{i}",
            body=body,
            body_size=len(body),
            content_type="application/json",
            properties={"content_type": "application/json", "delivery_mode": 2},
            headers={},
            reason="exhausted",
            error_type="tests.testapp.consumers.Boom",
            error_message=f"boom {i}",
            attempts=3,
            parked_at=now,
        )
        for i in range(n)
    ]
    return ParkedMessage.objects.bulk_create(objs, batch_size=1000)


def operator(*codenames: str, username: str = "op") -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in ("view_parkedmessage", *codenames):
        user.user_permissions.add(
            Permission.objects.get(codename=codename, content_type__app_label="django_rmq_retry")
        )
    return user


def action_names(response) -> set[str]:
    form = response.context["action_form"]
    if form is None:  # the admin hides the whole action bar
        return set()
    return {value for value, _label in form.fields["action"].choices if value}


def post_action(client, action: str, ids, *, url: str | None = None, across: bool = False, **extra):
    data = {
        "action": action,
        "_selected_action": [str(i) for i in ids],
        "index": "0",
        "select_across": "1" if across else "0",
        **extra,
    }
    return client.post(url or changelist_url(), data, follow=True)


def texts(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in response.context["messages"]]


# --------------------------------------------------------------------------------------------
# Permissions and view-only enforcement


@pytest.mark.django_db
def test_staff_without_action_permissions_sees_no_action_and_cannot_post_one(client):
    row = make_row()
    client.force_login(operator())
    response = client.get(changelist_url())
    assert response.status_code == 200
    assert action_names(response) == set()
    assert b'name="action"' not in response.content
    # Posting the action by hand does nothing.
    post_action(client, "requeue_selected", [row.pk])
    post_action(client, "discard_selected", [row.pk])
    row.refresh_from_db()
    assert row.status == ParkedStatus.PARKED
    assert not LogEntry.objects.exists()


@pytest.mark.django_db
def test_each_action_needs_its_own_permission(client):
    make_row()
    client.force_login(operator("requeue_parkedmessage", username="requeuer"))
    assert action_names(client.get(changelist_url())) == {
        "requeue_selected",
        "requeue_in_background",
        "republish_to_topic",
    }
    client.force_login(operator("discard_parkedmessage", username="discarder"))
    assert action_names(client.get(changelist_url())) == {"discard_selected"}
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    names = action_names(client.get(changelist_url()))
    assert names == {
        "requeue_selected",
        "requeue_in_background",
        "republish_to_topic",
        "discard_selected",
    }
    assert "delete_selected" not in names


@pytest.mark.django_db
def test_rows_are_view_only_even_for_a_superuser(client):
    row = make_row()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    change = reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk])
    assert client.get(reverse("admin:django_rmq_retry_parkedmessage_add")).status_code == 403
    page = client.get(change)
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert b"<textarea" not in page.content
    assert client.post(change, {"receiver": "x", "status": "requeued"}).status_code == 403
    delete = reverse("admin:django_rmq_retry_parkedmessage_delete", args=[row.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    row.refresh_from_db()
    assert (row.receiver, row.status) == (ALPHA, ParkedStatus.PARKED)


@pytest.mark.django_db
def test_user_without_view_permission_gets_no_page(client):
    make_row()
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(changelist_url()).status_code == 403
    summary = reverse("admin:django_rmq_retry_parkedmessage_summary")
    assert client.get(summary).status_code == 403


# --------------------------------------------------------------------------------------------
# Detail page: decoding and escaping


XSS = "<script>alert('x')</script>"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (json.dumps({"name": XSS}).encode(), "application/json"),
        (XSS.encode(), "text/plain"),
        (XSS.encode(), ""),
        (b"\x00\x01" + XSS.encode(), "application/octet-stream"),
    ],
)
def test_nothing_from_a_message_is_rendered_unescaped(client, body, content_type):
    row = make_row(
        body=body,
        content_type=content_type,
        headers={"x-note": XSS, XSS: "key"},
        properties={"content_type": content_type, "app_id": XSS},
        error_message=f"failed on {XSS}",
        error_type=XSS,
        traceback=f"Traceback ...\nValueError: {XSS}",
        fingerprint=XSS,
        history=[{"at": "now", "event": XSS, "reason": "exhausted"}],
        routing_key="<b>rk</b>",
    )
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    for url in (
        reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk]),
        changelist_url(),
        reverse("admin:django_rmq_retry_parkedmessage_summary"),
    ):
        html = client.get(url).content.decode()
        assert "<script>alert" not in html, url
        assert "<b>rk</b>" not in html
        assert "&lt;script&gt;" in html or "3c 73 63 72" in html, url


@pytest.mark.django_db
def test_detail_page_pretty_prints_json_and_shows_headers_traceback_history(client):
    row = make_row(
        body=b'{"order":17,"items":[1,2]}',
        headers={"rmq_retry_test-requeued": 1, "tenant": "acme"},
        traceback='Traceback (most recent call last):\n  File "x.py", line 1\nBoom: nope',
        history=[
            {"at": "2026-01-01T00:00:00", "event": "parked", "reason": "exhausted", "attempts": 3}
        ],
    )
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    html = client.get(
        reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk])
    ).content.decode()
    assert "&quot;order&quot;: 17" in html  # indented JSON, not the compact wire form
    assert "JSON · 26 bytes" in html
    assert "&quot;tenant&quot;: &quot;acme&quot;" in html
    assert "Boom: nope" in html
    assert "2026-01-01 00:00:00" in html  # the history, shown with seconds
    assert "download the raw body" in html
    raw = client.get(reverse("admin:django_rmq_retry_parkedmessage_body", args=[row.pk]))
    assert raw.content == b'{"order":17,"items":[1,2]}'
    assert raw["Content-Type"] == "application/octet-stream"
    assert raw["Content-Disposition"].startswith("attachment")


@pytest.mark.django_db
def test_huge_body_is_truncated_on_the_page(client):
    body = json.dumps({"blob": "x" * 300_000}).encode()
    row = make_row(body=body)
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    response = client.get(reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk]))
    html = response.content.decode()
    assert f"showing the first {64 * 1024} bytes" in html
    assert len(response.content) < 150_000


def test_body_preview_kinds():
    assert body_preview(b"") == ("empty", "", 0)
    kind, text, shown = body_preview(b'{"a":1}', "application/json")
    assert (kind, shown) == ("json", 7)
    assert text == '{\n  "a": 1\n}'
    assert body_preview("héllo".encode(), "text/plain")[:2] == ("text", "héllo")
    assert body_preview("héllo".encode("latin-1"), "text/plain; charset=latin-1")[1] == "héllo"
    kind, text, shown = body_preview(bytes(range(40)), "application/octet-stream")
    assert kind == "hex" and shown == 40
    assert text.splitlines()[0].startswith("00000000  00 01 02")
    # Invalid UTF-8 declared as JSON falls back to a hex dump, never raises.
    assert body_preview(b"\xff\xfe{", "application/json")[0] == "hex"
    # A cut in the middle of a multi-byte character still shows the text before it.
    kind, text, shown = body_preview(("é" * 100).encode(), "text/plain", limit=51)
    assert kind == "text" and text == "é" * 25
    # Binary bodies are cut at the hex limit.
    assert body_preview(b"\x00" * 100, hex_limit=32)[2] == 32


def test_body_preview_shows_compressed_bodies_inflated():
    body = gzip.compress(b'{"a": 1}')
    assert body_preview(body, "application/json", "gzip")[:2] == ("json", '{\n  "a": 1\n}')
    assert body_preview(zlib.compress(b"hi"), "text/plain", "deflate")[:2] == ("text", "hi")
    bomb = gzip.compress(b"\x00" * 10_000)  # inflates past 4 * limit: shown as it came
    assert body_preview(bomb, "application/octet-stream", "gzip", limit=100)[0] == "hex"
    assert body_preview(b"\x1f\x8b junk", "application/json", "gzip")[0] == "hex"
    assert hex_dump(b"AB\x00") == "00000000  41 42 00" + " " * 39 + "  |AB.|"


# --------------------------------------------------------------------------------------------
# Actions against the real broker


def step_until_sent(op_id: int, within: float = 60) -> RequeueOperation:
    """Step operation ``op_id`` in this process until every row of it was sent, refused or
    skipped (what follows is waiting for outcomes, which these tests do not report).
    ``within``: a bound for liveness, never a figure (a large run under tracemalloc on a
    loaded host takes minutes)."""

    def sent() -> bool:
        operations.advance_due(only=op_id)
        op = RequeueOperation.objects.get(pk=op_id)
        return op.sent + op.refused + op.skipped == op.total

    assert wait_for(sent, within, interval=0.1)
    return RequeueOperation.objects.get(pk=op_id)


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_requeue_selected_publishes_to_the_failed_receiver_only_then_marks_the_row(rmq, client):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    work.send({"id": 7, "fail": "always", "only": ["alpha"]})
    call_command("rmq_consume", "alpha", "beta", max_messages=4, max_idle_time=60, verbosity=0)
    row = ParkedMessage.objects.get()  # a real parking: 3 attempts in alpha, beta succeeded
    assert (row.receiver, row.attempts, row.status) == (ALPHA, 3, ParkedStatus.PARKED)
    assert rmq.depth(rmq.queue("alpha")) == 0

    client.force_login(operator("requeue_parkedmessage"))
    response = post_action(client, "requeue_selected", [row.pk], url=changelist_url(receiver=ALPHA))
    op = RequeueOperation.objects.get()
    assert texts(response) == [
        (
            "success",
            f"Operation #{op.pk} started: 1 message will be requeued to the receiver it "
            "failed in by the consumers, in the background.",
        )
    ]
    assert rmq.depth(rmq.queue("alpha")) == 0  # the request sent nothing
    op = step_until_sent(op.pk)
    assert op.sent == 1
    row.refresh_from_db()
    assert row.status == ParkedStatus.REQUEUED
    assert (row.status_changed_by, row.requeue_count) == (f"op (operation #{op.pk})", 1)

    got = rmq.get_all(rmq.queue("alpha"))
    assert len(got) == 1
    _method, props, body = got[0]
    assert json.loads(body) == {"id": 7, "fail": "always", "only": ["alpha"]}
    assert props.message_id == row.message_id
    h = rmq.names.header
    assert props.headers[h("requeued")] == 1
    assert props.headers[h("parked-id")] == str(row.pk)
    assert props.headers[h("operation")] == str(op.pk)
    assert h("attempt") not in props.headers
    assert rmq.depth(rmq.queue("beta")) == 0  # the sibling that succeeded gets nothing

    entry = LogEntry.objects.get()
    assert entry.user.username == "op"
    assert entry.object_id == str(row.pk)
    assert f"Started requeue operation #{op.pk} (1 rows)." in entry.change_message
    assert f"receiver={ALPHA}" in entry.change_message

    # A second click (or a second operator) does nothing to the same row.
    response = post_action(client, "requeue_selected", [row.pk])
    assert texts(response)[0][0] == "warning"
    second = RequeueOperation.objects.latest("pk")
    assert (second.total, second.state) == (0, OperationState.DONE)
    assert operations.advance_due(only=second.pk) == 0  # nothing to run
    assert rmq.depth(rmq.queue("alpha")) == 0


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_unroutable_rows_stay_parked_and_errors_show_no_traceback(rmq, client):
    """Republishing to a topic nobody is bound to any more: the broker returns the message."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    ok = rows_for(rmq, 1)[0]
    lost = [make_row(queue=ok.queue, routing_key="test.nobody-listens") for _ in range(2)]
    client.force_login(operator("requeue_parkedmessage"))
    response = client.post(
        changelist_url(),
        {
            "action": "republish_to_topic",
            "_selected_action": [str(r.pk) for r in (ok, *lost)],
            "select_across": "0",
            "confirm": "yes",
        },
        follow=True,
    )
    op = RequeueOperation.objects.get()
    assert texts(response)[0] == (
        "success",
        f"Operation #{op.pk} started: 3 messages will be republished to ALL receivers of "
        "their topics by the consumers, in the background.",
    )
    op = step_until_sent(op.pk)
    assert (op.mode, op.sent, op.refused) == ("topic", 1, 2)
    for row in lost:
        row.refresh_from_db()
        assert (row.status, row.requeue_count) == (ParkedStatus.PARKED, 0)
        # Why, on the row's own page: the operation's shows counts.
        assert row.history[-1]["event"] == "requeue refused"
        assert (
            "no queue is bound for routing key 'test.nobody-listens'" in (row.history[-1]["reason"])
        )
        detail = client.get(reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk]))
        assert "no queue is bound for routing key" in detail.content.decode()
    assert not ParkedClaim.objects.exists()  # the failed ones were let go
    ok.refresh_from_db()
    assert ok.status == ParkedStatus.REQUEUED
    # The copy that went out is handled (by alpha and beta: a topic's receivers); the
    # operation ends and says how many the broker refused.
    call_command("rmq_consume", "alpha", "beta", max_messages=2, max_idle_time=10, verbosity=0)

    def done() -> bool:
        operations.advance_due(only=op.pk)
        return RequeueOperation.objects.get(pk=op.pk).state == OperationState.DONE

    assert wait_for(done, 60, interval=0.1)
    op.refresh_from_db()
    assert op.state_reason == (
        "Done: 1 handled, 0 failed again, 2 refused by the broker (each one's history says why)."
    )
    page = client.get(reverse("admin:django_rmq_retry_requeueoperation_change", args=[op.pk]))
    assert page.status_code == 200
    assert "Traceback" not in page.content.decode()
    assert "ALL receivers" in LogEntry.objects.get().change_message


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_broker_down_the_click_still_answers_and_the_step_leaves_rows_parked(rmq, client, settings):
    """The request does not need the broker; the step that does says why it waits."""
    rows = rows_for(rmq, 3)
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "BROKER_URL": "amqp://guest:s3cret@127.0.0.1:1/%2F",  # nothing listens on port 1
        "CONNECT_TIMEOUT": 2,
    }
    from django_rmq_retry.publishing.per_thread import reset_publisher

    reset_publisher()
    client.force_login(operator("requeue_parkedmessage"))
    response = post_action(client, "requeue_selected", [r.pk for r in rows])
    op = RequeueOperation.objects.get()
    assert texts(response)[0][0] == "success"
    assert op.total == 3
    operations.advance_due(only=op.pk)
    op.refresh_from_db()
    assert op.state == OperationState.RUNNING
    assert op.state_reason.startswith("Broker unavailable, will retry:"), op.state_reason
    assert "cannot reach RabbitMQ" in op.state_reason
    assert "s3cret" not in op.state_reason
    page = client.get(reverse("admin:django_rmq_retry_requeueoperation_change", args=[op.pk]))
    html = page.content.decode()
    assert "s3cret" not in html and "Traceback" not in html
    statuses = set(ParkedMessage.objects.values_list("status", flat=True))
    assert statuses == {ParkedStatus.PARKED}
    assert not ParkedClaim.objects.exists()
    assert op.sent == 0
    assert set(op.items.values_list("state", flat=True)) == {"pending"}  # the next step resumes


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_republish_to_topic_asks_first_then_reaches_every_receiver(rmq, client):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    (row,) = rows_for(rmq, 1)
    client.force_login(operator("requeue_parkedmessage"))

    page = post_action(client, "republish_to_topic", [row.pk])
    html = page.content.decode()
    assert "Republish to ALL receivers of the topic?" in html
    assert "Every receiver of the topic gets a copy" in html
    assert "tests.testapp.consumers.alpha, tests.testapp.consumers.beta" in html
    row.refresh_from_db()
    assert row.status == ParkedStatus.PARKED  # nothing happened yet
    assert not RequeueOperation.objects.exists()
    assert rmq.depth(rmq.queue("alpha")) == rmq.depth(rmq.queue("beta")) == 0

    confirmed = client.post(
        changelist_url(),
        {
            "action": "republish_to_topic",
            "_selected_action": [str(row.pk)],
            "select_across": "0",
            "confirm": "yes",
        },
        follow=True,
    )
    op = RequeueOperation.objects.get()
    assert texts(confirmed)[0][1].startswith(f"Operation #{op.pk} started: 1 message will be")
    assert op.mode == "topic"
    assert rmq.depth(rmq.queue("alpha")) == rmq.depth(rmq.queue("beta")) == 0
    step_until_sent(op.pk)
    assert rmq.depth(rmq.queue("alpha")) == 1
    assert rmq.depth(rmq.queue("beta")) == 1
    row.refresh_from_db()
    assert row.status == ParkedStatus.REQUEUED
    assert "ALL receivers" in LogEntry.objects.get().change_message


@pytest.mark.django_db
def test_discard_selected_marks_rows_and_writes_history(client):
    keep, gone = make_row(), make_row()
    client.force_login(operator("discard_parkedmessage"))
    response = post_action(client, "discard_selected", [gone.pk])
    assert texts(response) == [("success", "Discarded 1 parked message.")]
    gone.refresh_from_db()
    keep.refresh_from_db()
    assert (gone.status, gone.status_changed_by) == (ParkedStatus.DISCARDED, "op")
    assert keep.status == ParkedStatus.PARKED
    entry = LogEntry.objects.get()
    assert (entry.user.username, entry.object_id) == ("op", str(gone.pk))
    assert entry.change_message.startswith("Discarded 1 parked message(s).")
    # It shows on the row's own history page in the admin.
    history = client.get(reverse("admin:django_rmq_retry_parkedmessage_history", args=[gone.pk]))
    assert "Discarded 1 parked message(s)." in history.content.decode()


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_all_matching_is_sent_in_batches_by_steps_each_row_once(rmq, client, settings):
    """What a click used to split by its time budget, the operation splits into steps of
    ``BATCH_SIZE``: each step sends the next batch, nothing twice."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "BATCH_SIZE": 100}
    rows = rows_for(rmq, 250)
    client.force_login(operator("requeue_parkedmessage"))
    url = changelist_url(receiver=ALPHA)
    post_action(client, "requeue_selected", [rows[0].pk], url=url, across=True)
    op = RequeueOperation.objects.get()
    assert op.total == 250
    seen = []
    for _step in range(3):
        assert operations.advance(op.pk) is not None
        op.refresh_from_db()
        seen.append(op.sent)
    assert seen == [100, 200, 250]
    assert ParkedMessage.objects.filter(status=ParkedStatus.REQUEUED).count() == 250
    assert wait_for(lambda: rmq.depth(rmq.queue("alpha")) >= 250, 30)
    assert rmq.depth(rmq.queue("alpha")) == 250  # every row once, none twice
    entry = LogEntry.objects.get()
    assert "all rows matching the filter" in entry.change_message


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_requeue_all_matching_20k_rows_in_flat_memory(rmq, client):
    """Select-across hands the operation a lazy queryset (one INSERT ... SELECT of ids);
    its steps stream the rows by pk in batches."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    n = 20_000
    body = json.dumps({"pad": "x" * 2000}).encode()
    rows = rows_for(rmq, n, body=body)
    bodies_mib = n * len(body) / 2**20
    client.force_login(operator("requeue_parkedmessage"))
    # One ordinary page load first, so lazily imported code is not counted as the action's.
    client.get(changelist_url(receiver=ALPHA))
    tracemalloc.start()
    started = time.monotonic()
    try:
        post_action(
            client,
            "requeue_selected",
            [rows[0].pk],
            url=changelist_url(receiver=ALPHA),
            across=True,
        )
        op = RequeueOperation.objects.get()
        assert op.total == n
        step_until_sent(op.pk, within=600)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - started
    peak_mib = peak / 2**20
    print(
        f"\nadmin requeue of {n} rows ({bodies_mib:.0f} MiB of bodies): {elapsed:.1f} s "
        f"under tracemalloc, peak traced memory {peak_mib:.1f} MiB"
    )
    assert ParkedMessage.objects.filter(status=ParkedStatus.REQUEUED).count() == n
    assert rmq.depth(rmq.queue("alpha")) == n
    # Loading every row would need at least the bodies' size; batches stay far below it.
    assert peak_mib < bodies_mib / 4, (peak_mib, bodies_mib)


# --------------------------------------------------------------------------------------------
# Summary (failure groups)


@pytest.mark.django_db
def test_summary_groups_parked_rows_and_links_to_the_filtered_list(client):
    for _ in range(3):
        make_row(error_message="order 17 not found")
    make_row(error_message="order 18 not found")  # same group: message text excluded
    other = make_row(
        receiver="tests.testapp.consumers.beta",
        error_type="KeyError",
        fingerprint="KeyError@tests/testapp/consumers.py:behave",
    )
    make_row(status=ParkedStatus.REQUEUED)  # not parked any more: not counted
    client.force_login(operator())
    changelist = client.get(changelist_url())
    summary_url = reverse("admin:django_rmq_retry_parkedmessage_summary")
    assert summary_url.encode() in changelist.content

    page = client.get(summary_url)
    groups = page.context["groups"]
    assert [(g["receiver"], g["count"]) for g in groups] == [
        (ALPHA, 4),
        ("tests.testapp.consumers.beta", 1),
    ]
    assert "5 messages are parked." in page.content.decode()

    listing = client.get(groups[1]["url"])
    assert listing.status_code == 200
    assert [r.pk for r in listing.context["cl"].result_list] == [other.pk]
    listing = client.get(groups[0]["url"])
    assert len(listing.context["cl"].result_list) == 4


@pytest.mark.django_db
def test_changelist_filters_and_search(client):
    a = make_row(message_id="abc-123", error_message="order 17 not found")
    b = make_row(receiver="tests.testapp.consumers.beta", reason="rejected", error_message="nope")
    client.force_login(operator())

    def ids(**query):
        response = client.get(changelist_url(**query))
        assert response.status_code == 200
        return {r.pk for r in response.context["cl"].result_list}

    assert ids() == {a.pk, b.pk}
    assert ids(receiver="tests.testapp.consumers.beta") == {b.pk}
    assert ids(reason__exact="rejected") == {b.pk}
    assert ids(status__exact="parked") == {a.pk, b.pk}
    assert ids(q="abc-123") == {a.pk}
    assert ids(q="abc") == set()  # message ids match exactly
    assert ids(q="order 17") == {a.pk}
    assert ids(queue=a.queue, error_type=a.error_type) == {a.pk, b.pk}


# --------------------------------------------------------------------------------------------
# Pages that do not grow with the table (#16): what each page asks the database


def changelist_queries(client, **query: str) -> tuple[object, list[str]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        response = client.get(changelist_url(**query))
    assert response.status_code == 200
    return response, [q["sql"] for q in captured.captured_queries]


@pytest.mark.django_db
def test_list_filters_and_counts_never_scan_the_table(client):
    make_row()
    make_row(receiver="tests.testapp.consumers.beta", error_type="KeyError", fingerprint="")
    client.force_login(operator())
    for query in ({}, {"status__exact": "parked"}, {"_facets": "True"}, {"q": "boom"}):
        response, sqls = changelist_queries(client, **query)
        text = " ".join(sqls).upper()
        # No SELECT DISTINCT for filter choices, no date hierarchy (MIN/MAX, dates), no facet
        # counts, and the count is capped (COUNT over a LIMITed subquery).
        assert "DISTINCT" not in text, query
        scans = [s for s in sqls if "MIN(" in s.upper() and "WITH RECURSIVE" not in s.upper()]
        assert scans == [], query
        counts = [s for s in sqls if "COUNT(" in s.upper()]
        assert counts and all("LIMIT 10001" in s.upper() for s in counts), counts
        assert response.context["cl"].model_admin.date_hierarchy is None
    # The sidebar still lists the values, read from the index.
    filters = {spec.title: spec for spec in response.context["cl"].filter_specs}
    receivers = [value for value in filters["receiver"].lookup_choices]
    assert receivers == [ALPHA, "tests.testapp.consumers.beta"]
    assert list(filters["failure group"].lookup_choices) == [
        "",
        "tests.testapp.consumers.Boom@tests/testapp/consumers.py:behave",
    ]


@pytest.mark.django_db
def test_a_count_past_the_cap_reads_as_a_lower_bound(client, monkeypatch):
    from django_rmq_retry.admin import CappedPaginator

    monkeypatch.setattr(CappedPaginator, "cap", 3)
    monkeypatch.setattr(ParkedMessageAdmin, "list_per_page", 2)
    for i in range(5):
        make_row(message_id=f"m{i}")
    client.force_login(operator())
    response = client.get(changelist_url())
    assert response.context["cl"].result_count == 4  # cap + 1: "more than 3"
    html = response.content.decode()
    assert "3+ parked messages" in html
    # Pages reach the cap: page 2 lists rows 3 and 4 of the newest first.
    page2 = client.get(changelist_url(p="2"))
    assert len(page2.context["cl"].result_list) == 2
    # Below the cap the count is exact.
    small = client.get(changelist_url(message_id="m1"))
    assert small.context["cl"].result_count == 1
    assert "1 parked message" in small.content.decode()


@pytest.mark.django_db
def test_search_matches_ids_exactly_and_whole_words_of_the_error(client):
    from django.db import connection

    a = make_row(
        message_id="Abc-123", correlation_id="order-17", error_message="Order 17 timed out"
    )
    b = make_row(error_message="card declined for payment 9")
    client.force_login(operator())

    def ids(term: str) -> set[int]:
        response, sqls = changelist_queries(client, q=term)
        if connection.vendor == "postgresql":
            assert any("to_tsvector('simple'::regconfig" in s for s in sqls)
        assert not any("UPPER(" in s.upper() for s in sqls)  # iexact never used an index
        return {r.pk for r in response.context["cl"].result_list}

    assert ids("Abc-123") == {a.pk}
    assert ids("abc-123") == set()  # ids are exact, case included
    assert ids("order-17") == {a.pk}
    assert ids("TIMED out") == {a.pk}  # words: any case, all of them
    assert ids("declined payment") == {b.pk}
    assert ids("declined 17") == set()
    assert ids("zebrafish") == set()
    c = make_row(error_message="cache foo_bar at 100% load, timed out")
    assert ids("foo_bar") == {c.pk}  # LIKE's wildcards are taken literally
    assert ids("100%") == {c.pk}
    assert ids("load,") == {c.pk}
    assert ids("timed out") == {a.pk, c.pk}


@pytest.mark.django_db
def test_park_key_has_one_index(db):
    from django.db import connection

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, ParkedMessage._meta.db_table)
    on_key = sorted(name for name, c in constraints.items() if c["columns"] == ["park_key"])
    assert on_key == ["rmqr_parked_park_key"]
    if connection.vendor == "postgresql":
        assert "rmqr_parked_error_words" in constraints  # the full-text index (migration 0001)
    make_row(park_key="k1")
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        make_row(park_key="k1")


# --------------------------------------------------------------------------------------------
# Retry policies


@pytest.mark.django_db
def test_retry_policy_form_lists_receivers_and_validates(client):
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    add = reverse("admin:django_rmq_retry_retrypolicy_add")
    page = client.get(add)
    choices = dict(page.context["adminform"].form.fields["receiver"].choices)
    assert ALPHA in choices
    assert "tests.testapp.consumers.gamma" in choices
    assert "10 attempts" in choices["tests.testapp.consumers.gamma"]

    data = {
        "receiver": ALPHA,
        "enabled": "on",
        "max_attempts": "0",
        "initial_delay": "5",
        "multiplier": "2",
        "max_delay": "1",
        "jitter": "none",
        "dont_retry": "",
    }
    bad = client.post(add, data)
    assert bad.status_code == 200
    errors = " ".join(bad.context["adminform"].form.non_field_errors())
    assert "max_delay must be >= initial_delay" in errors
    assert not RetryPolicy.objects.exists()

    unknown = client.post(add, {**data, "receiver": "not.a.receiver"})
    assert "receiver" in unknown.context["adminform"].form.errors

    ok = client.post(add, {**data, "max_attempts": "4", "max_delay": "60"}, follow=True)
    assert ok.status_code == 200
    policy = RetryPolicy.objects.get()
    assert (policy.receiver, policy.max_attempts) == (ALPHA, 4)
    listing = client.get(reverse("admin:django_rmq_retry_retrypolicy_changelist")).content
    assert b"5s, 10s, 20s" in listing


@pytest.mark.django_db
def test_summary_link_works_for_rows_without_a_failure_group(client):
    bare = make_row(error_type="", fingerprint="", reason="undecodable")
    make_row()
    client.force_login(operator())
    groups = client.get(reverse("admin:django_rmq_retry_parkedmessage_summary")).context["groups"]
    (empty,) = [g for g in groups if g["fingerprint"] == ""]
    listing = client.get(empty["url"])
    assert listing.status_code == 200
    assert [r.pk for r in listing.context["cl"].result_list] == [bare.pk]


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_two_operators_requeueing_the_same_rows_at_once_never_publish_one_twice(rmq):
    """A double click, or two operators: the claims let each row go out exactly once."""
    import threading

    from django.db import connections
    from django.test import Client

    call_command("rmq_consume", setup_only=True, verbosity=0)
    n = 600
    rows = rows_for(rmq, n)
    users = [operator("requeue_parkedmessage", username=f"op{i}") for i in range(2)]
    url = changelist_url(receiver=ALPHA)
    results: list[list[tuple[str, str]]] = []
    barrier = threading.Barrier(2)

    def click(user: User) -> None:
        try:
            c = Client()
            c.force_login(user)
            barrier.wait()
            response = post_action(c, "requeue_selected", [rows[0].pk], url=url, across=True)
            # Read the messages from this response's HTML: response.context comes from a
            # process-wide signal, so with two threads it can hold the other click's page.
            html = response.content.decode()
            results.append(
                re.findall(r'<li class="(success|warning|error|info)">([^<]*)</li>', html)
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2, results
    assert all(shown[0][0] == "success" for shown in results), results
    ops = list(RequeueOperation.objects.order_by("pk").values_list("pk", flat=True))
    assert len(ops) == 2
    assert rmq.depth(rmq.queue("alpha")) == 0  # neither click sent anything

    # Two processes' worth of stepping, at once, over the same rows.
    def step(op_id: int) -> None:
        try:
            step_until_sent(op_id)
        finally:
            connections.close_all()

    steppers = [threading.Thread(target=step, args=(op_id,)) for op_id in ops]
    for t in steppers:
        t.start()
    for t in steppers:
        t.join(120)
    done = RequeueOperation.objects.filter(pk__in=ops)
    assert sum(op.sent for op in done) == n  # the claims let each row out once
    assert all(op.sent + op.skipped == n for op in done), [(o.sent, o.skipped) for o in done]
    assert ParkedMessage.objects.filter(status=ParkedStatus.REQUEUED).count() == n
    assert wait_for(lambda: rmq.depth(rmq.queue("alpha")) >= n, 30)
    assert rmq.depth(rmq.queue("alpha")) == n
    assert LogEntry.objects.count() == 2


@pytest.mark.django_db
def test_actions_need_a_csrf_token():
    from django.test import Client

    row = make_row()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    response = strict.post(
        changelist_url(),
        {"action": "discard_selected", "_selected_action": [str(row.pk)], "index": "0"},
    )
    assert response.status_code == 403
    row.refresh_from_db()
    assert row.status == ParkedStatus.PARKED
