"""Alerts on failure groups that are not spam: one notification per group per window.

A new failure group (parked rows of a (receiver, failure group, error type) never alerted
on), or a group grown past ``ALERT_THRESHOLD`` parked rows since its last alert, gives one
notification, and then none for that group for ``ALERT_WINDOW_SECONDS``, however many
messages park and however many consumer processes look. The look reads the kept group
counts (a small table the database keeps, never the parked rows), every
``ALERT_CHECK_SECONDS``, on the consumers' operations thread; the claim of an alert is one
conditional write, so two processes never send the same one.

The notification goes to ``mail_admins`` unless ``ALERT_HANDLER`` names a callable, which
gets an :class:`Alert` (see docs/howto/operators.md for a Slack-style webhook).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.mail import mail_admins
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import app_settings
from ..models import FailureGroupAlert, ParkedGroupCount, ParkedStatus

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

    @property
    def text(self) -> str:
        grown = f" (was {self.previous})" if self.previous else ""
        return (
            f"{self.kind}: {self.count} parked message(s){grown} for {self.receiver}: "
            f"{self.fingerprint or self.error_type}"
        )


def _handler() -> Callable[[Alert], None]:
    dotted = app_settings.ALERT_HANDLER
    if dotted:
        func: Callable[[Alert], None] = import_string(dotted)
        return func
    return lambda alert: mail_admins(f"Parked messages: {alert.kind}", alert.text)


def check(now: datetime | None = None) -> list[Alert]:
    """Send what is due now; the alerts sent (by this call)."""
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
            alert = Alert(NEW, *key, count=group.count, previous=0)
            if not _claim_new(key, group.count, now):
                continue
        elif group.count - state.count >= threshold and state.alerted_at <= now - window:
            alert = Alert(GROWING, *key, count=group.count, previous=state.count)
            claimed = FailureGroupAlert.objects.filter(
                pk=state.pk, alerted_at=state.alerted_at
            ).update(alerted_at=now, count=group.count)
            if not claimed:  # another process sent it
                continue
        else:
            continue
        try:
            _handler()(alert)
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
