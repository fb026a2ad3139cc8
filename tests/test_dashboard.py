"""The dashboard: hourly snapshots of the kept group counts, charted as inline SVG (no
script, no CDN), never a read of the parked table; readable on a phone (Chromium)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_rmq_retry.models import ParkedMessage, ParkedStatus
from django_rmq_retry.parking import snapshots
from tests.test_admin import make_row, operator
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operator import login, shots

HOSTILE = "<script>window.__pwned=1</script>"


def _incident() -> datetime:
    """Thirty rows parked three hours ago, twenty of them requeued since; when "now" was."""
    now = timezone.now()
    rows = [make_row(fingerprint=f"Boom at {HOSTILE}") for _ in range(30)]
    snapshots.take(now - timedelta(hours=3))
    ParkedMessage.objects.filter(pk__in=[r.pk for r in rows[:20]]).update(
        status=ParkedStatus.REQUEUED
    )
    snapshots.take(now)
    return now


@pytest.mark.django_db
def test_the_dashboard_reads_snapshots_never_the_parked_rows(client):
    now = _incident()
    # Read as of the snapshots' "now": an hour that began since is not the point here.
    (group,) = snapshots.series(snapshots.RANGES["24h"], now=now)
    assert [p for _h, p, _r in group.points][-4:] == [30, 30, 30, 10]  # the drop
    assert group.points[-1][2] == 20
    client.force_login(operator())
    url = reverse("admin:django_rmq_retry_parkedmessage_dashboard")
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url + "?range=7d")
    assert response.status_code == 200
    sqls = " ".join(q["sql"] for q in captured.captured_queries)
    assert '"django_rmq_retry_parkedmessage"' not in sqls
    html = response.content.decode()
    assert html.count("<polyline") == 2 and "<svg" in html
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert "cdn" not in html.lower()
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(url).status_code == 403


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_dashboard_on_a_phone(live_server, browser, tmp_path):  # noqa: F811
    _incident()
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page = login(browser, live_server, "ops", "correct horse", width=390)
    page.goto(f"{live_server.url}/admin/django_rmq_retry/parkedmessage/dashboard/")
    chart = page.locator(".rmq-chart svg").first
    box = chart.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390
    assert page.inner_text("[data-key=parked]") == "10"
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1
    page.screenshot(path=str(shots(tmp_path) / "operator-dashboard-phone.png"), full_page=True)
    page.click("#rmq-range-7d")
    page.wait_for_url("**range=7d")
