"""A typed receiver's invalid message in the admin, in headless Chromium (Debian's chromium
through Playwright): the reason filter finds it under "invalid", the detail page lists its
failing fields, and the edit page refuses an edit that still does not fit, the field errors
next to the JSON, before it offers to requeue one that does."""

from __future__ import annotations

import decimal
import json

import msgspec
import pytest
from django.contrib.auth.models import User

from django_rmq_retry import Topic, receiver
from django_rmq_retry.core.names import Names
from django_rmq_retry.models import ParkedMessage, RequeueOperation
from django_rmq_retry.testing import InMemoryBroker
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operator import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


class Refund(msgspec.Struct):
    order_id: int
    amount: decimal.Decimal


refunds = Topic("typed.browser.refund", schema=Refund)


def test_an_invalid_message_is_found_shown_and_its_edit_revalidated(
    registry_snapshot,
    live_server,
    browser,  # noqa: F811
):
    @receiver(refunds)
    def refund(message, **kwargs):
        pass

    with InMemoryBroker() as broker:  # parked by the consumer's own code, as a foreign
        broker.model.publish(  # client's body would be
            Names(broker.names.prefix).work_exchange,
            refunds.routing_key,
            b'{"order_id": 12}',
            {"content_type": "application/json", "delivery_mode": 2, "headers": {}},
        )
        broker.run_until_idle()
    row = ParkedMessage.objects.get()
    assert row.reason == "invalid" and row.field_errors == [
        {"loc": ["amount"], "msg": "Field required"}
    ]

    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/")
    page.get_by_role("link", name="Invalid (does not fit its schema)").click()
    page.wait_for_url("**reason__exact=invalid**")
    assert page.locator("#result_list tbody tr").count() == 1

    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{row.pk}/change/")
    table = page.inner_text(".rmq-field-errors")
    assert "amount" in table and "Field required" in table

    page.click("#rmq-edit-one")
    page.wait_for_selector("#rmq-edit-form")
    page.fill("#rmq-edit-body", json.dumps({"order_id": 12, "amount": "twelve"}))
    page.click("#rmq-edit-preview")
    assert "does not fit Refund" in page.inner_text("#rmq-edit-error")
    errors = page.inner_text("#rmq-edit-field-errors")
    assert "amount" in errors
    assert page.locator("#rmq-edit-confirm").count() == 0

    page.fill("#rmq-edit-body", json.dumps({"order_id": 12, "amount": "12.00"}))
    page.click("#rmq-edit-preview")
    assert '"amount": "12.00"' in page.inner_text("#rmq-edit-diff")
    assert page.locator("#rmq-edit-field-errors").count() == 0
    assert page.locator("#rmq-edit-confirm").count() == 1
    assert RequeueOperation.objects.count() == 0  # previewed: nothing started
