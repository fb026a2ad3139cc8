"""Failure-group alerts: one per group per window, from the kept group counts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from django_rmq_retry.parking import alerts
from tests.test_admin import make_row

pytestmark = pytest.mark.django_db

received: list[alerts.Alert] = []


def capture(alert: alerts.Alert) -> None:
    received.append(alert)


@pytest.fixture
def handler(settings):
    received.clear()
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "ALERT_HANDLER": "tests.test_alerts.capture",
        "ALERT_THRESHOLD": 100,
        "ALERT_WINDOW_SECONDS": 3600,
    }
    return received


def test_a_new_group_alerts_once_and_growth_once_per_window(handler):
    for _ in range(50):
        make_row()  # one group, fifty messages
    now = timezone.now()
    assert [a.kind for a in alerts.check(now)] == [alerts.NEW]
    assert (handler[0].count, handler[0].receiver) == (50, "tests.testapp.consumers.alpha")
    assert alerts.check(now) == []  # nothing new
    for _ in range(120):
        make_row()
    assert alerts.check(now + timedelta(minutes=10)) == []  # grown, but inside the window
    grown = alerts.check(now + timedelta(hours=1, seconds=1))
    assert [(a.kind, a.count, a.previous) for a in grown] == [(alerts.GROWING, 170, 50)]
    assert alerts.check(now + timedelta(hours=3)) == []  # not grown by 100 since
    make_row(receiver="tests.testapp.consumers.beta", fingerprint="KeyError at x.py:f")
    assert [(a.kind, a.receiver) for a in alerts.check(now + timedelta(hours=3))] == [
        (alerts.NEW, "tests.testapp.consumers.beta")
    ]
    assert len(handler) == 3


def test_mail_admins_by_default(settings):
    settings.ADMINS = [("ops", "ops@example.com")]
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "ALERT_HANDLER": None}
    make_row(error_message="<script>x</script>")
    alerts.check()
    assert len(mail.outbox) == 1
    assert "new failure group" in mail.outbox[0].subject
    assert "1 parked message(s)" in mail.outbox[0].body
