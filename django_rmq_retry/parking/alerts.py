"""Alerts on failure groups that are not spam: one notification per group per window.

A new failure group (parked rows of a (receiver, failure group, error type) never alerted
on), or a group grown past ``ALERT_THRESHOLD`` parked rows since its last alert, gives one
notification, and then none for that group for ``ALERT_WINDOW_SECONDS``, however many
messages park and however many consumer processes look. The look reads the kept group
counts (a small table the database keeps, never the parked rows), every
``ALERT_CHECK_SECONDS``, on the consumers' operations thread; the claim of an alert is one
conditional write, so two processes never send the same one.

The notification goes to ``mail_admins`` unless ``ALERT_HANDLER`` names a callable, which
gets an :class:`Alert` (see docs/howto/operators.md for a Slack-style webhook). With neither
a handler nor ``ADMINS`` nobody would read it (``mail_admins`` returns quietly without
``ADMINS``), so nothing is claimed: the process says so once (check
``django_rmq_retry.W003``), and the alerts start, new groups included, once someone is
configured. Each alert links to its group's parked rows in the admin, absolute under
``ALERT_ADMIN_URL``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.core.mail import mail_admins
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import app_settings
from ..models import FailureGroupAlert, ParkedGroupCount, ParkedStatus
from .queries import group_query

logger = logging.getLogger("django_rmq_retry.alerts")

NEW, GROWING = "new failure group", "failure group growing"


@dataclass(frozen=True)
class Alert:
    """What a handler gets."""

    kind: str  # NEW or GROWING
    receiver: str
    fingerprint: str
    error_type: str
    count: int  # parked rows in the group now
    previous: int  # at the group's last alert (0 for a new group)
    url: str = ""  # the group's parked rows in the admin ("" when the admin is not routed)

    @property
    def text(self) -> str:
        grown = f" (was {self.previous})" if self.previous else ""
        line = (
            f"{self.kind}: {self.count} parked message(s){grown} for {self.receiver}: "
            f"{self.fingerprint or self.error_type}"
        )
        return f"{line}\n{self.url}" if self.url else line


def group_url(receiver: str, fingerprint: str, error_type: str) -> str:
    """The admin list filtered to one group's parked rows (the failure-groups page's link).

    Absolute under ``ALERT_ADMIN_URL`` (the admin's address as operators open it: a consumer
    has no request to learn the host from), else the site's own path. "" when the project
    routes no admin: a link is a convenience, never a reason to lose the alert."""
    try:
        changelist = reverse("admin:django_rmq_retry_parkedmessage_changelist")
        index = reverse("admin:index")
    except Exception as exc:  # NoReverseMatch, no ROOT_URLCONF, a URLconf that fails
        logger.debug("alerts carry no admin link: %s", exc)
        return ""
    query = urlencode(group_query(receiver, fingerprint, error_type))
    base = str(app_settings.ALERT_ADMIN_URL or "")
    if not base:
        return f"{changelist}?{query}"
    below_admin = changelist.removeprefix(index).lstrip("/")
    return f"{base.rstrip('/')}/{below_admin}?{query}"


#: Why this process sends no alert, each said once (not every ALERT_CHECK_SECONDS).
_said: set[str] = set()


def _say_once(problem: str) -> None:
    if problem not in _said:
        _said.add(problem)
        logger.warning("%s", problem)


def recipient() -> Callable[[Alert], None] | None:
    """Who gets the alerts: ``ALERT_HANDLER``, else ``mail_admins`` when ``ADMINS`` names
    someone; ``None`` when nobody would read them."""
    dotted = app_settings.ALERT_HANDLER
    if dotted:
        func: Callable[[Alert], None] = import_string(dotted)
        return func
    if settings.ADMINS:
        return lambda alert: mail_admins(f"Parked messages: {alert.kind}", alert.text)
    return None


def check(now: datetime | None = None) -> list[Alert]:
    """Send what is due now; the alerts sent (by this call).

    Nobody to send to (or a handler that cannot be imported): nothing is claimed, so the
    alerts that were due go out once someone is configured."""
    try:
        send = recipient()
    except ImportError as exc:
        _say_once(f"failure-group alerts not sent: ALERT_HANDLER cannot be imported ({exc})")
        return []
    if send is None:
        _say_once(
            "failure-group alerts not sent: nobody receives them (django_rmq_retry.W003: "
            "ALERT_HANDLER is None and settings.ADMINS is empty); set ADMINS or "
            "ALERT_HANDLER, or ALERT_CHECK_SECONDS = 0 to turn alerts off"
        )
        return []
    now = now or timezone.now()
    threshold = int(app_settings.ALERT_THRESHOLD)
    window = timedelta(seconds=float(app_settings.ALERT_WINDOW_SECONDS))
    known = {(a.receiver, a.fingerprint, a.error_type): a for a in FailureGroupAlert.objects.all()}
    sent = []
    groups = ParkedGroupCount.objects.filter(status=ParkedStatus.PARKED, count__gt=0)
    for group in groups:
        key = (group.receiver, group.fingerprint, group.error_type)
        state = known.get(key)
        if state is None:
            alert = Alert(NEW, *key, count=group.count, previous=0, url=group_url(*key))
            if not _claim_new(key, group.count, now):
                continue
        elif group.count - state.count >= threshold and state.alerted_at <= now - window:
            alert = Alert(
                GROWING, *key, count=group.count, previous=state.count, url=group_url(*key)
            )
            claimed = FailureGroupAlert.objects.filter(
                pk=state.pk, alerted_at=state.alerted_at
            ).update(alerted_at=now, count=group.count)
            if not claimed:  # another process sent it
                continue
        else:
            continue
        try:
            send(alert)
        except Exception:
            logger.exception("alert handler failed for %s", alert.text)
        else:
            logger.warning("alert sent: %s", alert.text)
        sent.append(alert)
    return sent


def _claim_new(key: tuple[str, str, str], count: int, now: datetime) -> bool:
    receiver, fingerprint, error_type = key
    try:
        with transaction.atomic():
            FailureGroupAlert.objects.create(
                receiver=receiver,
                fingerprint=fingerprint,
                error_type=error_type,
                alerted_at=now,
                count=count,
            )
    except IntegrityError:  # another process claimed it first
        return False
    return True
