"""The operator's pages as a newcomer meets them, in headless Chromium (Debian's chromium
through Playwright; never a downloaded browser): the detail page's Requeue and Discard
buttons, times with seconds, who changed the row, our own exceptions by their short name,
the changelist's key columns visible at 1280 px, and a hostile body that renders inert.

Screenshots go to the test's tmp dir; ``RMQ_SCREENSHOT_DIR=docs/img`` refreshes the docs'.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_rmq_retry.models import ParkedMessage, ParkedStatus, RequeueOperation
from tests.test_admin import operator, rows_for, step_until_sent
from tests.test_browser import SCREENSHOT_DIR, browser  # noqa: F401  (the fixture)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

HOSTILE = (
    b'{"note": "<script>window.__pwned = 1</script><img src=x onerror=\\"window.__pwned = 2\\">"}'
)
REJECT = "django_rmq_retry.core.errors.Reject"


def shots(tmp_path: Path) -> Path:
    where = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
    where.mkdir(parents=True, exist_ok=True)
    return where


def login(browser, live_server, username: str, password: str, width: int = 1280):  # noqa: F811
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(15_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    return page


def test_detail_page_has_buttons_seconds_who_and_short_names(
    rmq,
    live_server,
    browser,  # noqa: F811
    tmp_path,
):
    rows = rows_for(rmq, 2, body=HOSTILE)
    ParkedMessage.objects.filter(pk=rows[0].pk).update(
        error_type=REJECT, reason="rejected", error_message="<b>not bold</b>"
    )
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")
    where = shots(tmp_path)

    # The changelist at 1280 px: Status, Reason and Parked at are on the screen.
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/")
    for column in ("status", "reason", "parked_at_display"):
        box = page.locator(f"#result_list thead th.column-{column}").bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1280, (column, box)
    assert "Reject" in page.inner_text("#result_list")
    assert REJECT not in page.inner_text("#result_list")
    page.screenshot(path=str(where / "operator-changelist-1280.png"), full_page=True)

    # The detail page of the rejected one.
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{rows[0].pk}/change/")
    text = page.inner_text("#content")
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text), text
    assert REJECT not in text and "Reject" in text
    assert "the consumer (parked after the last attempt)" in text
    # Hostile body and error: shown as text, never run.
    assert "<script>window.__pwned = 1</script>" in page.inner_text(".rmq-body")
    assert "<b>not bold</b>" in text
    assert page.evaluate("typeof window.__pwned") == "undefined"
    page.screenshot(path=str(where / "operator-detail.png"), full_page=True)

    # Requeue from the detail page: an operation of this row, whose page the click shows;
    # once a step sent it, the row is marked requeued, by ops through the operation.
    page.click("#rmq-requeue-one")
    page.locator(".messagelist .success").wait_for()
    op = RequeueOperation.objects.get()
    assert f"Operation #{op.pk} started: 1 message" in page.inner_text(".messagelist")
    assert list(op.items.values_list("parked_id", flat=True)) == [rows[0].pk]
    step_until_sent(op.pk)
    rows[0].refresh_from_db()
    assert (rows[0].status, rows[0].status_changed_by) == (
        ParkedStatus.REQUEUED,
        f"ops (operation #{op.pk})",
    )
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{rows[0].pk}/change/")
    assert page.locator("#rmq-requeue-one").count() == 0  # not parked any more
    assert "ops" in page.inner_text("#content")

    # Discard the other one from its page.
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{rows[1].pk}/change/")
    page.click("#rmq-discard-one")
    page.locator(".messagelist .success").wait_for()
    rows[1].refresh_from_db()
    assert (rows[1].status, rows[1].status_changed_by) == (ParkedStatus.DISCARDED, "ops")


def test_a_viewer_sees_no_buttons_and_a_post_is_refused(
    rmq,
    live_server,
    browser,  # noqa: F811
    client,
):
    (row,) = rows_for(rmq, 1)
    viewer = operator()
    viewer.set_password("pw")
    viewer.save()
    page = login(browser, live_server, "op", "pw")
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{row.pk}/change/")
    assert page.locator("#rmq-requeue-one, #rmq-discard-one").count() == 0
    client.force_login(viewer)
    for name in ("requeue_one", "discard_one"):
        url = reverse(f"admin:django_rmq_retry_parkedmessage_{name}", args=[row.pk])
        assert client.post(url).status_code == 403
        assert client.get(url).status_code == 405
    row.refresh_from_db()
    assert (row.status, row.requeue_count, row.status_changed_by) == (ParkedStatus.PARKED, 0, "")
