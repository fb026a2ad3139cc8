"""The "Dependencies" page in headless Chromium: an operator opens a breaker, sees why and
since when, closes it again and reads the history; a viewer sees the page without a button
and a forged post gets 403. Then ``manage.py rmq_dependencies`` and the metrics say the same.
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command

from django_rmq_retry.breakers import state
from django_rmq_retry.core.breaker import State
from django_rmq_retry.models import DependencyEvent
from tests.test_admin import operator
from tests.test_browser import browser  # noqa: F401  (the fixture)
from tests.test_browser_operator import login, shots

PAYMENTS = {"EXCEPTIONS": ["builtins.ConnectionError"], "TRIP_FAILURES": 3, "PROBE_AFTER": 10}
PAGE = "/admin/django_rmq_retry/dependency/"


@pytest.fixture
def payments(settings):
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "DEPENDENCIES": {"payments": PAYMENTS, "mail": PAYMENTS},
        "ALERT_HANDLER": None,
    }


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_operator_opens_and_closes_a_breaker_in_the_admin(
    payments,
    live_server,
    browser,  # noqa: F811
    tmp_path,
):
    ops = operator(username="ops")
    ops.user_permissions.add(
        Permission.objects.get(
            codename="operate_dependency", content_type__app_label="django_rmq_retry"
        )
    )
    page = login(browser, live_server, "ops", "pw")
    where = shots(tmp_path)
    page.goto(f"{live_server.url}{PAGE}")
    assert page.inner_text("#rmq-dep-payments [data-state]") == "closed"
    assert page.inner_text("#rmq-dep-mail [data-state]") == "closed"

    page.click("#rmq-dep-open-payments")
    page.wait_for_selector("#rmq-dep-payments [data-state=open]")
    assert "payments: opened." in page.inner_text(".messagelist").lower()
    row = page.inner_text("#rmq-dep-payments")
    assert "opened by ops (admin)" in row and "closed → open" in row
    assert page.inner_text("#rmq-dep-mail [data-state]") == "closed"  # only that one
    page.screenshot(path=str(where / "admin-dependencies.png"), full_page=True)
    assert state.read("payments").state is State.OPEN

    page.click("#rmq-dep-close-payments")
    page.wait_for_selector("#rmq-dep-payments [data-state=closed]")
    assert state.read("payments").state is State.CLOSED
    assert list(DependencyEvent.objects.order_by("at", "id").values_list("to_state", "by")) == [
        ("open", "ops (admin)"),
        ("closed", "ops (admin)"),
    ]

    # A viewer: the page, no button; a forged post is refused and changes nothing.
    operator(username="viewer")
    viewer = login(browser, live_server, "viewer", "pw")
    viewer.goto(f"{live_server.url}{PAGE}")
    assert viewer.inner_text("#rmq-dep-payments [data-state]") == "closed"
    assert viewer.locator("#rmq-dep-open-payments").count() == 0
    token = viewer.context.cookies()
    csrf = next(c["value"] for c in token if c["name"] == "csrftoken")
    forged = viewer.request.post(
        f"{live_server.url}{PAGE}payments/open/",
        headers={"X-CSRFToken": csrf, "Referer": f"{live_server.url}{PAGE}"},
    )
    assert forged.status == 403
    assert state.read("payments").state is State.CLOSED


@pytest.mark.django_db
def test_rmq_dependencies_lists_opens_and_closes(payments):
    out = io.StringIO()
    call_command("rmq_dependencies", "--open", "payments", stdout=out)
    assert "payments: open now" in out.getvalue()
    out = io.StringIO()
    call_command("rmq_dependencies", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("mail: closed") and lines[1].startswith("payments: open")
    assert "failures in window 0/3" in lines[1] and "next probe" in lines[1]
    assert "opened by" in lines[1] and "rmq_dependencies" in lines[1]
    out = io.StringIO()
    call_command("rmq_dependencies", "--open", "payments", stdout=out)
    assert "already open" in out.getvalue()
    call_command("rmq_dependencies", "--close", "payments", stdout=io.StringIO())
    assert state.read("payments").state is State.CLOSED
    with pytest.raises(CommandError, match="Unknown dependency 'nope'"):
        call_command("rmq_dependencies", "--close", "nope")


@pytest.mark.django_db
def test_the_metrics_read_each_breaker_from_its_row(payments):
    pytest.importorskip("prometheus_client")
    from django_rmq_retry.observability.metrics import database_families

    state.force("payments", State.OPEN, "test")
    families = {f.name: f for f in database_families(own_thread=False)}
    states = {
        s.labels["dependency"]: s.value
        for s in families["django_rmq_retry_dependency_state"].samples
    }
    assert states == {"mail": 0, "payments": 2}
    trips = {
        s.labels["dependency"]: s.value
        for s in families["django_rmq_retry_dependency_trips"].samples
        if s.name.endswith("_total")
    }
    assert trips == {"mail": 0, "payments": 1}


def test_a_viewer_without_parked_view_permission_sees_no_page(client, payments, db):
    User.objects.create_user("nobody", password="pw", is_staff=True)
    client.login(username="nobody", password="pw")
    assert client.get(PAGE).status_code == 403
