"""The detail page's Requeue, in headless Chromium: the click lands on the operation it
started, a consumer process sends and handles the message, and the page ends "Done"
without a reload; the message was handled once.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from django_rmq_retry.models import ParkedMessage, ParkedStatus, RequeueOperation
from tests.conftest import start_consumer
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operations import said_state, until_said
from tests.test_browser_operator import login
from tests.test_operations import handled_ids, park_rows

pytestmark = [
    pytest.mark.browser,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def test_requeue_on_the_detail_page_lands_on_its_operation_which_ends_done(
    rmq,
    live_server,
    browser,  # noqa: F811
):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    rows = park_rows(rmq, [{"id": i} for i in range(3)])
    row = rows[2]
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")

    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{row.pk}/change/")
    page.click("#rmq-requeue-one")
    page.wait_for_selector("#rmq-progress")
    op = RequeueOperation.objects.get()
    assert page.url == (
        f"{live_server.url}/admin/django_rmq_retry/requeueoperation/{op.pk}/change/"
    )
    assert f"Operation #{op.pk} started: 1 message" in page.inner_text(".messagelist")
    assert said_state(page) == ["Running"] * 4
    assert rmq.depth(rmq.queue("alpha")) == 0  # the click sent nothing

    child = start_consumer(rmq.prefix, rmq.log, "alpha")
    try:
        page.wait_for_selector("#rmq-progress[data-state=done]", timeout=120_000)
        until_said(page, "Done")
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)
    assert page.inner_text("#content h1") == f"Requeue operation #{op.pk}: Done"
    assert page.inner_text("[data-key=handled]") == "1"
    assert page.inner_text("[data-key=left]") == "0"
    assert handled_ids(rmq) == Counter([2])  # that message, once
    row.refresh_from_db()
    assert row.status == ParkedStatus.REQUEUED
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 2
