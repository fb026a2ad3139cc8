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


# Someone receives them ------------------------------------------------------------------------
def _check_ids(**overrides) -> list[str]:
    from django.test import override_settings

    from django_rmq_retry.checks import check_settings
    from django_rmq_retry.conf import app_settings

    conf = {**app_settings.user_settings(), **overrides.pop("rmq", {})}
    with override_settings(RMQ_RETRY=conf, **overrides):
        return [m.id for m in check_settings()]


def test_the_check_warns_when_alerts_are_on_and_nobody_would_receive_them():
    nobody = {"ALERT_HANDLER": None, "ALERT_CHECK_SECONDS": 30}
    assert "django_rmq_retry.W003" in _check_ids(ADMINS=[], rmq=nobody)
    assert "django_rmq_retry.W003" not in _check_ids(
        ADMINS=[("ops", "ops@example.com")], rmq=nobody
    )
    handler = {**nobody, "ALERT_HANDLER": "tests.test_alerts.capture"}
    assert "django_rmq_retry.W003" not in _check_ids(ADMINS=[], rmq=handler)
    off = {**nobody, "ALERT_CHECK_SECONDS": 0}
    assert "django_rmq_retry.W003" not in _check_ids(ADMINS=[], rmq=off)


@pytest.mark.parametrize("base", ["ops.example.com/admin/", 42, "ftp://ops.example.com/"])
def test_a_link_base_that_is_not_an_http_url_is_refused(base):
    assert "django_rmq_retry.E017" in _check_ids(rmq={"ALERT_ADMIN_URL": base})


def test_nobody_to_tell_claims_nothing_and_says_so_once(settings, caplog):
    import logging

    settings.ADMINS = []
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "ALERT_HANDLER": None}
    alerts._said.clear()
    make_row()
    with caplog.at_level(logging.WARNING, logger="django_rmq_retry.alerts"):
        assert alerts.check() == []
        assert alerts.check() == []
    told = [r.getMessage() for r in caplog.records if r.name == "django_rmq_retry.alerts"]
    assert len(told) == 1 and "django_rmq_retry.W003" in told[0], told
    assert mail.outbox == []
    # Nothing was claimed: the group alerts as soon as someone is there to read it.
    settings.ADMINS = [("ops", "ops@example.com")]
    assert [a.kind for a in alerts.check()] == [alerts.NEW]
    assert len(mail.outbox) == 1


def test_the_alert_links_to_its_groups_parked_rows(settings):
    from urllib.parse import parse_qs, urlsplit

    settings.ADMINS = [("ops", "ops@example.com")]
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "ALERT_HANDLER": None}
    make_row(receiver="tests.testapp.consumers.beta", fingerprint="KeyError at shop/r.py:send")
    (alert,) = alerts.check()
    link = urlsplit(alert.url)
    assert (link.scheme, link.path) == ("", "/admin/django_rmq_retry/parkedmessage/")
    assert parse_qs(link.query) == {
        "status__exact": ["parked"],
        "receiver": ["tests.testapp.consumers.beta"],
        "fingerprint": ["KeyError at shop/r.py:send"],
        "error_type": ["tests.testapp.consumers.Boom"],
    }
    assert alert.url in mail.outbox[0].body
    # With the admin's public address, absolute (a mail or chat client needs the host).
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "ALERT_ADMIN_URL": "https://ops.example.com/admin"}
    url = alerts.group_url(alert.receiver, alert.fingerprint, alert.error_type)
    assert url == f"https://ops.example.com/admin/django_rmq_retry/parkedmessage/?{link.query}"


def test_without_an_admin_route_the_alert_goes_out_without_a_link(handler, settings):
    settings.ROOT_URLCONF = "tests.test_alerts"  # this module: no urlpatterns at all
    make_row()
    (alert,) = alerts.check()
    assert alert.url == "" and handler == [alert]
    assert "\n" not in alert.text


urlpatterns: list = []  # the URLconf of the test above
