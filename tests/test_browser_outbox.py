"""The outbox's admin in a real browser: an event sent through the outbox to a topic nobody
consumes yet is refused by the broker and held; once the consumer is deployed the operator
selects it and publishes it again, and the receiver handles it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Topic
from django_rmq_retry.models import OutboxMessage, OutboxStatus
from django_rmq_retry.registry import default_registry
from tests.conftest import read_log
from tests.test_browser import browser  # noqa: F401  (the Chromium fixture)
from tests.testapp.consumers import _log

pytestmark = [
    pytest.mark.browser,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

refunds = Topic("test.refunds")
RECEIVER = "tests.test_browser_outbox.issue_refund"


def issue_refund(message, **kwargs):
    _log("done", "issue_refund", message)


def test_operator_publishes_a_held_outbox_message_again(
    registry_snapshot,
    rmq,
    live_server,
    browser,  # noqa: F811
    settings,
):
    conf = {**settings.RMQ_RETRY, "PREFIX": rmq.prefix, "OUTBOX_MAX_ATTEMPTS": 1}
    with override_settings(RMQ_RETRY=conf):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        refunds.send({"id": 77, "order_id": 77}, outbox=True)  # no queue bound yet
        row = OutboxMessage.objects.get()
        assert (row.status, row.attempts) == (OutboxStatus.HELD, 1)

        # The consumer of the topic is deployed: its queue now exists.
        default_registry.register(issue_refund, [refunds])
        call_command("rmq_consume", setup_only=True, verbosity=0)
        User.objects.create_superuser("ops", "ops@example.com", "correct horse")

        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_default_timeout(15_000)
        changelist = f"{live_server.url}/admin/django_rmq_retry/outboxmessage/"
        page.goto(f"{live_server.url}/admin/login/?next=/admin/django_rmq_retry/outboxmessage/")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "correct horse")
        page.click("input[type=submit]")
        page.wait_for_url(changelist)
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 1
        listing = page.inner_text("#result_list")
        assert "Held (needs an operator)" in listing and "unroutable" in listing

        rows.first.locator("th a, td a").first.click()
        page.wait_for_url(f"**/outboxmessage/{row.pk}/change/")
        assert '"order_id": 77' in page.content()
        assert "test.refunds" in page.content()

        page.goto(changelist)
        page.locator("#result_list input.action-select").first.check()
        page.select_option("select[name=action]", "publish_again")
        page.click("button[name=index]")
        success = page.locator(".messagelist .success")
        success.wait_for()
        assert success.inner_text() == "1 message will be published by the relay."
        row.refresh_from_db()
        assert (row.status, row.attempts) == (OutboxStatus.PENDING, 0)

        call_command("rmq_relay", once=True, verbosity=0)
        assert OutboxMessage.objects.count() == 0
        call_command("rmq_consume", RECEIVER, max_messages=1, max_idle_time=10, verbosity=0)
    done = [e["id"] for e in read_log(rmq.log) if e["receiver"] == "issue_refund"]
    assert done == [77]
