"""Per-attempt history: bounded records in a header of the retry copies, the parking
attempt in the row's history, requeues and edits with who; shown on the detail page (in
headless Chromium: Debian's chromium through Playwright)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from django_rmq_retry import parking
from django_rmq_retry.core import history
from django_rmq_retry.models import ParkedMessage, ParkedStatus
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operator import login, shots
from tests.testapp.events import work


def test_the_history_is_bounded_to_the_first_and_last_attempts():
    records: list[str] = []
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for attempt in range(1, 10_001):
        records = history.add(records, history.record(attempt, at, "h", 1, 3.2, "E at f:g", 0.1))
    assert len(records) == history.KEEP_FIRST + history.KEEP_LAST
    assert [r["attempt"] for r in history.parse(records)] == ["1", "2", "9998", "9999", "10000"]
    assert max(len(r) for r in records) < 100  # a small header
    assert history.add("garbage", "x") == ["x"]  # whatever came in the header


@pytest.mark.browser
@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_attempts_parkings_and_the_requeue_between_them_are_told(
    rmq,
    live_server,
    browser,  # noqa: F811
    tmp_path,
):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    work.send(
        {
            "id": 5,
            "fail": "always",
            "only": ["alpha"],
            "note": "<img src=x onerror=window.__pwned=1>",
        }
    )
    # Until 2 s idle, not a count of 3: the admin's timeline shows two attempt records that
    # read the same (one-second times) once, so the rounds must not share a second.
    call_command("rmq_consume", "alpha", max_idle_time=2, verbosity=0)
    row = ParkedMessage.objects.get()
    header = row.headers[rmq.names.header("history")]
    tried = history.parse(header)
    assert [r["attempt"] for r in tried] == ["1", "2"]  # the retried ones, in the copies
    assert all(r["next"].startswith("retry in") for r in tried)
    assert "Boom at tests/testapp/consumers.py:behave" in tried[0]["what"]
    assert re.fullmatch(r".+:\d+", tried[0]["where"]) and tried[0]["took"].endswith("ms")
    last = history.parse([row.history[-1]["attempt"]])[0]
    assert (last["attempt"], last["next"]) == ("3", "parked")

    # A requeue, and it fails again: both rounds stay, the requeue is told with who.
    parking.requeue(ParkedMessage.objects.all(), user="ops")
    call_command("rmq_consume", "alpha", max_idle_time=2, verbosity=0)
    row.refresh_from_db()
    assert row.status == ParkedStatus.PARKED and row.park_count == 2
    assert [e["event"] for e in row.history] == ["parked", "requeued", "parked"]
    assert row.history[1]["by"] == "ops"
    carried = history.parse(row.headers[rmq.names.header("history")])
    assert [r["attempt"] for r in carried] == ["1", "2", "1", "2"]  # survived the requeue

    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse")
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/{row.pk}/change/")
    table = page.inner_text(".rmq-history")
    assert table.count("attempt 1") == 2 and table.count("attempt 3") == 2
    assert "requeued" in table and "ops" in table
    assert page.evaluate("typeof window.__pwned") == "undefined"
    page.screenshot(path=str(shots(tmp_path) / "operator-history.png"), full_page=True)
