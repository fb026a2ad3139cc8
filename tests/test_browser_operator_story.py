"""The operators' how-to story (``docs/howto/operators.md``, part 4), step by step, in
headless Chromium against a live server, with a real consumer process and the real broker.

A receiver breaks and a failure group of parked messages appears; the operator opens the
group from *Failure groups*, starts **Requeue selected with a canary, ramp or rate…** with
a canary and "stop at the first new failure"; the receiver still fails, so the canary stops and the
page says so; the receiver is fixed (``tests/story``: a switch file the test deletes); the
operator clicks **Resume** and the rest is sent; the page ends *Done*. As the how-to says,
the canary's messages that failed before the resume stay parked with their new failure and
a new operation over the group picks them up: at the end every message was handled by the
receiver exactly once and none is left parked.

What it catches: a Resume that re-stops on the canary's old failure (or sends nothing); a
resume that sends a canary message again; a page that never says *Stopped* or *Done*
without a reload; a count on the page that disagrees with what the receiver handled.
"""

from __future__ import annotations

import importlib
import json
import signal
from collections import Counter

import pytest
from django.contrib.auth.models import User

from django_rmq_retry.models import OperationState, ParkedMessage, ParkedStatus, RequeueOperation
from django_rmq_retry.registry import default_registry
from tests import waiting
from tests.conftest import declare_for, read_log, start_consumer
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operations import offered, until_said
from tests.test_browser_operator import login, shots

pytestmark = [
    pytest.mark.browser,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

N = 12
CANARY = 3
RECEIVER = "tests.story.consumers.print_label"
#: The action as the how-to names it (its label, not its value: the story is the docs').
ACTION = "Requeue selected with a canary, ramp or rate…"


@pytest.fixture
def story(registry_snapshot, request):
    """``tests.story.consumers`` registered in this process too (its queue declared), the
    way the ``dbapp`` fixture does it: imported again, after any earlier test forgot it."""
    from tests.story import consumers

    for rec in default_registry.all():
        if rec.name.startswith(consumers.__name__ + "."):
            default_registry.unregister(rec.func)
    module = importlib.reload(consumers)
    declare_for(request)
    return module


def done_ids(rmq) -> Counter[int]:
    return Counter(
        e["id"]
        for e in read_log(rmq.log)
        if e["event"] == "done" and e["receiver"] == "print_label"
    )


def parked() -> int:
    return ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count()


def start_a_requeue(page, live_server, *, canary: int | None) -> RequeueOperation:
    """From *Failure groups*: the group's link, select all, the action the how-to names."""
    before = set(RequeueOperation.objects.values_list("pk", flat=True))
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/summary/")
    groups = page.locator("#result_list tbody tr")
    assert groups.count() == 1
    groups.first.locator("td.count a").click()
    page.wait_for_url("**fingerprint=*")
    page.check("#action-toggle")
    page.select_option("select[name=action]", label=ACTION)
    page.click("button[name=index]")
    page.wait_for_selector("#rmq-op-form")
    if canary is not None:
        page.fill("#id_canary", str(canary))
    assert page.is_checked("#id_stop_on_failure")  # the form's default, as the how-to says
    page.click("#rmq-op-form input[type=submit]")
    page.wait_for_selector("#rmq-progress")
    (op,) = RequeueOperation.objects.exclude(pk__in=before)
    return op


def test_the_how_to_story_canary_stops_fix_resume_then_the_rest(
    story,
    rmq,
    live_server,
    browser,  # noqa: F811
    tmp_path,
):
    broken = tmp_path / "printer-broken"
    broken.touch()
    consumer = start_consumer(
        rmq.prefix,
        rmq.log,
        "print_label",
        DJANGO_SETTINGS_MODULE="tests.story.settings",
        RMQ_TEST_STORY_BROKEN=str(broken),
    )
    try:
        # A failure group appears: every message fails all its attempts and parks.
        for i in range(N):
            story.labels.send({"id": i})
        waiting.until(f"{N} parked", lambda: parked() == N, child=consumer)
        assert done_ids(rmq) == Counter()
        assert set(ParkedMessage.objects.values_list("receiver", flat=True)) == {RECEIVER}
        User.objects.create_superuser("ops", "ops@example.com", "correct horse")
        page = login(browser, live_server, "ops", "correct horse")
        where = shots(tmp_path)

        # 4. The canary, with "stop at the first new failure" (the form's default).
        op = start_a_requeue(page, live_server, canary=CANARY)
        assert (op.total, op.canary, op.stop_on_failure) == (N, CANARY, True)
        canary_rows = list(ParkedMessage.objects.order_by("pk").values_list("pk", flat=True))[
            :CANARY
        ]

        # The receiver still fails: the canary stops at a failure, and the page says so.
        page.wait_for_selector("#rmq-progress[data-state=stopped]", timeout=120_000)
        until_said(page, "Stopped at a new failure")
        assert "The canary failed" in page.inner_text("[data-key=reason]")
        assert offered(page) == ["resume", "cancel"]
        # Every canary copy fails again (the stop came at the first); nothing else went.
        page.wait_for_function(
            f"document.querySelector('[data-key=failed_again]').textContent === '{CANARY}'",
            timeout=120_000,
        )
        assert page.inner_text("[data-key=sent]") == str(CANARY)
        assert page.inner_text("[data-key=left]") == str(N - CANARY)
        assert done_ids(rmq) == Counter()
        page.screenshot(path=str(where / "operator-story-stopped.png"), full_page=True)

        # The receiver is fixed; the operator clicks Resume; the rest is sent.
        broken.unlink()
        page.click("#rmq-op-resume")
        page.locator(".messagelist li").first.wait_for()
        page.wait_for_selector("#rmq-progress[data-state=done]", timeout=120_000)
        until_said(page, "Done")
        assert offered(page) == []
        numbers = {
            key: page.inner_text(f"[data-key={key}]")
            for key in ("total", "sent", "handled", "failed_again", "left", "waiting", "unknown")
        }
        assert numbers == {
            "total": str(N),
            "sent": str(N),
            "handled": str(N - CANARY),
            "failed_again": str(CANARY),
            "left": "0",
            "waiting": "0",
            "unknown": "0",
        }
        page.screenshot(path=str(where / "operator-story-done.png"), full_page=True)
        op.refresh_from_db()
        assert op.state == OperationState.DONE, op.state_reason
        # The canary's messages stay parked with their new failure; the rest ran once each.
        still = ParkedMessage.objects.filter(status=ParkedStatus.PARKED)
        assert sorted(still.values_list("pk", flat=True)) == canary_rows
        canary_ids = {
            json.loads(bytes(body))["id"] for body in still.values_list("body", flat=True)
        }
        assert done_ids(rmq) == Counter(set(range(N)) - canary_ids)

        # "A new operation over the group picks them up."
        again = start_a_requeue(page, live_server, canary=None)
        assert again.total == CANARY
        page.wait_for_selector("#rmq-progress[data-state=done]", timeout=120_000)
        until_said(page, "Done")
        assert page.inner_text("[data-key=handled]") == str(CANARY)
    finally:
        consumer.send_signal(signal.SIGTERM)
        consumer.communicate(timeout=60)
    assert done_ids(rmq) == Counter(range(N))  # each message handled exactly once
    assert parked() == 0
