"""A background requeue from the admin, in headless Chromium (Debian's chromium through
Playwright): the operator starts it with a canary, a ramp and a rate, watches its progress
live while a consumer process sends the messages, and a second operator sees the same
operation; pause, resume and cancel; a viewer sees no button and gets 403.

Screenshots go to the test's tmp dir; ``RMQ_SCREENSHOT_DIR=docs/img`` refreshes the docs'.
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from django_rmq_retry.models import OperationState, ParkedMessage, ParkedStatus, RequeueOperation
from django_rmq_retry.parking import operations
from tests.conftest import read_log, start_consumer
from tests.test_admin import operator
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operator import login, shots
from tests.test_operations import park_rows

pytestmark = [
    pytest.mark.browser,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

VERBS = ("pause", "resume", "cancel")


def said_state(page) -> list[str]:
    """Every place the page names the operation's state: the heading, the breadcrumb, the
    State field and the progress box."""
    return page.locator(
        "[data-live=state_label], #rmq-progress [data-key=state_label]"
    ).all_inner_texts()


def offered(page) -> list[str]:
    return [verb for verb in VERBS if page.is_visible(f"#rmq-op-{verb}")]


def until_said(page, label: str) -> None:
    """Until the page (without a reload) names the state ``label`` everywhere."""
    page.wait_for_function(
        """label => [...document.querySelectorAll(
               "[data-live=state_label], #rmq-progress [data-key=state_label]")]
             .every(el => el.textContent === label)""",
        arg=label,
        timeout=60_000,
    )


def test_operator_starts_a_canary_ramped_rated_requeue_and_watches_it(
    rmq,
    live_server,
    browser,  # noqa: F811
    tmp_path,
):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    n = 40
    park_rows(rmq, [{"id": i, "note": "<script>window.__pwned=1</script>"} for i in range(n)])
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")
    where = shots(tmp_path)

    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "requeue_in_background")
    page.click("button[name=index]")
    page.wait_for_selector("#rmq-op-form")
    assert f"{n} parked messages are selected" in page.inner_text("#rmq-op-count")
    page.fill("#id_canary", "3")
    page.check("#id_ramp")
    page.fill("#id_rate", "20")
    page.screenshot(path=str(where / "operator-operation-start.png"), full_page=True)
    page.click("#rmq-op-form input[type=submit]")
    page.wait_for_selector("#rmq-progress")
    op = RequeueOperation.objects.get()
    assert (op.total, op.canary, op.ramp, op.rate, op.created_by) == (n, 3, True, 20.0, "ops")
    assert page.get_attribute("#rmq-progress", "data-state") == "running"
    assert said_state(page) == ["Running"] * 4
    assert offered(page) == ["pause", "cancel"]

    # A consumer process steps it; the page follows without a reload.
    child = start_consumer(rmq.prefix, rmq.log, "alpha")
    try:
        page.wait_for_function(
            "Number(document.querySelector('[data-key=sent]').textContent) > 0", timeout=60_000
        )
        page.screenshot(path=str(where / "operator-operation-progress.png"), full_page=True)
        page.wait_for_selector("#rmq-progress[data-state=done]", timeout=120_000)
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)
    assert page.inner_text("[data-key=handled]") == str(n)
    assert page.inner_text("[data-key=left]") == "0"
    assert page.inner_text("[data-key=unknown]") == "0"
    assert page.evaluate("typeof window.__pwned") == "undefined"
    # The whole page says so, without a reload, and offers nothing to do any more.
    until_said(page, "Done")
    assert said_state(page) == ["Done"] * 4
    assert page.inner_text("#content h1") == f"Requeue operation #{op.pk}: Done"
    assert page.inner_text(".breadcrumbs").endswith(f"Requeue operation #{op.pk} (Done)")
    assert "Running" not in page.inner_text("#content")
    assert page.title().startswith(f"Requeue operation #{op.pk}: Done |")
    assert offered(page) == []
    page.screenshot(path=str(where / "operator-operation-done.png"), full_page=True)
    handled = Counter(e["id"] for e in read_log(rmq.log) if e["event"] == "done")
    assert handled == Counter(range(n))  # exactly once each
    assert not ParkedMessage.objects.filter(status=ParkedStatus.PARKED).exists()

    # A second operator, a reload: the same operation, the same numbers.
    User.objects.create_superuser("ops2", "ops2@example.com", "correct horse")
    other = login(browser, live_server, "ops2", "correct horse")
    other.goto(f"{live_server.url}/admin/django_rmq_retry/requeueoperation/")
    other.locator("#result_list a", has_text=str(op.pk)).first.click()
    other.wait_for_selector("#rmq-progress[data-state=done]")
    assert other.inner_text("[data-key=handled]") == str(n)


def test_pause_resume_cancel_from_the_page_and_a_viewer_is_refused(
    rmq,
    live_server,
    browser,  # noqa: F811
    client,
):
    park_rows(rmq, [{"id": i} for i in range(5)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", rate=1.0)
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")
    page.goto(f"{live_server.url}/admin/django_rmq_retry/requeueoperation/{op.pk}/change/")
    for button, state, then in (
        ("#rmq-op-pause", OperationState.PAUSED, ["resume", "cancel"]),
        ("#rmq-op-resume", OperationState.RUNNING, ["pause", "cancel"]),
        ("#rmq-op-cancel", OperationState.CANCELLED, []),
    ):
        page.click(button)
        page.locator(".messagelist li").first.wait_for()
        op.refresh_from_db()
        assert op.state == state
        assert offered(page) == then
    assert page.inner_text(".messagelist li") == f"Operation #{op.pk} cancelled."
    page.wait_for_selector("#rmq-progress[data-state=cancelled]")

    second = operations.create(ParkedMessage.objects.all(), user="ops")
    viewer = operator(username="viewer")
    viewer.set_password("pw")
    viewer.save()
    vpage = login(browser, live_server, "viewer", "pw")
    vpage.goto(f"{live_server.url}/admin/django_rmq_retry/requeueoperation/{second.pk}/change/")
    assert vpage.locator("#rmq-progress").count() == 1
    assert vpage.locator("#rmq-op-pause, #rmq-op-cancel").count() == 0
    client.force_login(viewer)
    for verb in ("pause", "cancel"):
        url = reverse(f"admin:django_rmq_retry_requeueoperation_{verb}", args=[second.pk])
        assert client.post(url).status_code == 403
    # Nor may a viewer start one: the action is not offered, and a forged post does nothing.
    response = client.post(
        reverse("admin:django_rmq_retry_parkedmessage_changelist"),
        {"action": "requeue_in_background", "_selected_action": [1], "confirm": "yes"},
    )
    assert response.status_code in (200, 302)
    second.refresh_from_db()
    assert second.state == OperationState.RUNNING
    assert RequeueOperation.objects.count() == 2


def test_the_page_follows_what_another_operator_or_a_stop_did(
    rmq,
    live_server,
    browser,  # noqa: F811
    client,
):
    """Nothing steps the operation here: every change comes from elsewhere (another
    operator, a stop), and the open page follows each one without a reload."""
    park_rows(rmq, [{"id": i} for i in range(5)])
    op = operations.create(ParkedMessage.objects.all(), user="ops", rate=1.0)
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")
    page.goto(f"{live_server.url}/admin/django_rmq_retry/requeueoperation/{op.pk}/change/")
    assert said_state(page) == ["Running"] * 4
    assert offered(page) == ["pause", "cancel"]
    # Nothing steps it: once it is overdue, the page says why nothing moves.
    RequeueOperation.objects.filter(pk=op.pk).update(next_at=timezone.now() - timedelta(minutes=1))
    page.wait_for_selector("#rmq-op-idle", state="visible", timeout=60_000)
    assert "rmq_operations" in page.inner_text("#rmq-op-idle")

    assert operations.pause(op.pk, "ops2")
    until_said(page, "Paused")
    assert offered(page) == ["resume", "cancel"]
    assert not page.is_visible("#rmq-op-idle")  # paused: nothing is expected to step it
    assert page.inner_text("[data-live=state_changed_by]") == "ops2"
    assert page.inner_text("[data-live=reason]") == "Paused by ops2."

    # A stop (what a failed canary does), then a resume by someone else.
    RequeueOperation.objects.filter(pk=op.pk).update(
        state=OperationState.STOPPED, state_reason="The canary failed: message #1 failed again."
    )
    until_said(page, "Stopped at a new failure")
    assert offered(page) == ["resume", "cancel"]
    assert operations.resume(op.pk, "ops2")
    until_said(page, "Running")
    assert offered(page) == ["pause", "cancel"]

    # What the page no longer offers is refused, and said so, if posted anyway.
    assert operations.pause(op.pk, "ops2") and operations.cancel(op.pk, "ops2")
    until_said(page, "Cancelled")
    assert offered(page) == []
    client.force_login(User.objects.get(username="ops"))
    url = reverse("admin:django_rmq_retry_requeueoperation_resume", args=[op.pk])
    response = client.post(url, follow=True)
    (said,) = [str(m) for m in response.context["messages"]]
    assert said == f"Operation #{op.pk} was not resumed: it is cancelled (by ops2)."
    op.refresh_from_db()
    assert op.state == OperationState.CANCELLED
