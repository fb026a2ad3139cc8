"""End to end in a real browser: a message really fails and parks, an operator requeues it
from the admin in headless Chromium, and the receiver handles it.

The story is the classic one: ``send_receipt`` needs the order's invoice, which was not
written yet when the message came, so the message exhausts its attempts and parks. Once the
invoice exists (the "fix"), the operator filters the parked messages, opens the one that
failed, requeues it, and it goes through.

Uses Debian's ``/usr/bin/chromium`` through Playwright; never a downloaded browser.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from django_rmq_retry import Topic
from django_rmq_retry.models import ParkedMessage, ParkedStatus, RequeueOperation
from django_rmq_retry.registry import default_registry
from testproject.shop.models import Invoice
from tests.conftest import read_log
from tests.test_admin import step_until_sent
from tests.testapp.consumers import _log
from tests.testapp.events import work

pytestmark = [
    pytest.mark.browser,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Screenshots go to the test's tmp dir; refresh the README's with RMQ_SCREENSHOT_DIR=docs.
SCREENSHOT_DIR = os.environ.get("RMQ_SCREENSHOT_DIR")
RECEIVER = "tests.test_browser.send_receipt"

receipts = Topic("test.receipts")


def send_receipt(message, **kwargs):
    """Needs the order's invoice; fails with Invoice.DoesNotExist until it exists."""
    _log("start", "send_receipt", message)
    Invoice.objects.get(order_id=message.body["order_id"])
    _log("done", "send_receipt", message)


@pytest.fixture
def receipt_receiver(registry_snapshot):
    default_registry.register(
        send_receipt,
        [receipts],
        retry={
            "max_attempts": 2,
            "initial_delay": 0.1,
            "multiplier": 1.0,
            "max_delay": 0.1,
            "jitter": "none",
        },
    )


@pytest.fixture
def browser(monkeypatch):
    # Playwright's sync API keeps an event loop on this thread; the test's own ORM calls are
    # plain synchronous code, which Django would otherwise refuse next to a running loop.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium", pytrace=False)
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def consume() -> None:
    call_command("rmq_consume", "alpha", "beta", RECEIVER, max_idle_time=2, verbosity=0)


def test_operator_requeues_a_parked_message_from_the_admin(
    receipt_receiver, rmq, live_server, browser, tmp_path
):
    # 1. Real failures: two alpha errors, one beta rejection, and the receipt with no invoice.
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in (1, 2):
        work.send({"id": i, "fail": "always", "only": ["alpha"]})
    work.send({"id": 3, "reject": True, "only": ["beta"]})
    receipts.send({"id": 501, "order_id": 501})
    consume()
    parked = {r.receiver: r for r in ParkedMessage.objects.all()}
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 4
    receipt = parked[RECEIVER]
    assert (receipt.attempts, receipt.reason) == (2, "exhausted")
    assert receipt.error_type == "testproject.shop.models.Invoice.DoesNotExist"
    events = [e for e in read_log(rmq.log) if e["receiver"] == "send_receipt"]
    assert [(e["event"], e["attempt"]) for e in events] == [("start", 1), ("start", 2)]

    # 2. The fix: the invoice now exists. The receiver has not run since.
    Invoice.objects.create(order_id=501)
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")

    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(15_000)
    # Start with the admin's navigation sidebar folded, leaving the table more room.
    page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    changelist = f"{live_server.url}/admin/django_rmq_retry/parkedmessage/"
    page.goto(f"{live_server.url}/admin/login/?next=/admin/django_rmq_retry/parkedmessage/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_url(changelist)
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 4
    assert "Invoice.DoesNotExist" in page.inner_text("#result_list")
    shots = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "admin-changelist.png"), full_page=True)

    # 3. The failure groups: alpha's two Boom errors form one group; one click lists them.
    page.click("text=Failure groups")
    page.wait_for_url("**/parkedmessage/summary/")
    groups = page.locator("#result_list tbody tr")
    assert groups.count() == 3
    assert groups.first.locator("td.count").inner_text() == "2"
    page.screenshot(path=str(shots / "admin-failure-groups.png"), full_page=True)
    groups.first.locator("td.count a").click()
    page.wait_for_url("**fingerprint=*")
    assert rows.count() == 2
    assert "tests.testapp.consumers.Boom" in page.inner_text("#result_list")
    page.goto(changelist)

    # 3b. Search from the search bar: an exact message id, then words of the error message
    #     (any case; on PostgreSQL through the full-text index). No date hierarchy above the
    #     list (it scanned the table) and no "Show counts" link (facets scanned it too).
    assert page.locator("nav.toplinks").count() == 0
    assert page.get_by_text("Show counts").count() == 0
    page.fill("#searchbar", receipt.message_id)
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=*")
    assert rows.count() == 1
    assert RECEIVER.rsplit(".", 1)[-1] in page.inner_text("#result_list")
    page.fill("#searchbar", "MATCHING query")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=MATCHING*")
    assert rows.count() == 1
    page.goto(changelist)

    # 4. Filter by receiver in the sidebar.
    page.locator("#changelist-filter a", has_text=RECEIVER).first.click()
    page.wait_for_url("**receiver=*")
    assert rows.count() == 1
    filtered_url = page.url

    # 5. Open the message: body decoded, error and traceback shown.
    rows.first.locator("th a, td a").first.click()
    page.wait_for_url(re.compile(rf"/parkedmessage/{receipt.pk}/change/"))
    body = page.inner_text(".rmq-body")
    assert '"order_id": 501' in body
    assert "Invoice matching query does not exist" in page.content()
    page.screenshot(path=str(shots / "admin-detail.png"), full_page=True)

    # 6. Back to the filtered list: select the row, run "Requeue selected".
    page.goto(filtered_url)
    page.locator("#result_list input.action-select").first.check()
    page.select_option("select[name=action]", "requeue_selected")
    page.click("button[name=index]")
    # The click starts a background operation and shows its page; a step (a consumer's
    # housekeeping thread, here this process) sends the message.
    success = page.locator(".messagelist .success")
    success.wait_for()
    op = RequeueOperation.objects.get()
    assert success.inner_text() == (
        f"Operation #{op.pk} started: 1 message will be requeued to the receiver it failed "
        "in by the consumers, in the background."
    )
    assert page.inner_text("#content h1").startswith(f"Requeue operation #{op.pk}")
    step_until_sent(op.pk)
    page.goto(filtered_url)
    assert "Requeued" in page.inner_text("#result_list")
    receipt.refresh_from_db()
    assert (receipt.status, receipt.status_changed_by) == (
        ParkedStatus.REQUEUED,
        f"ops (operation #{op.pk})",
    )

    # 7. The receiver handles the requeued message (attempts reset: attempt 1 again).
    consume()
    events = [e for e in read_log(rmq.log) if e["receiver"] == "send_receipt"]
    assert [(e["event"], e["attempt"]) for e in events] == [
        ("start", 1),
        ("start", 2),
        ("start", 1),
        ("done", 1),
    ]
    assert events[-1]["id"] == 501
    # Nothing else moved: the other three are still parked, the receipt stays requeued.
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 3
    receipt.refresh_from_db()
    assert (receipt.status, receipt.park_count) == (ParkedStatus.REQUEUED, 1)
