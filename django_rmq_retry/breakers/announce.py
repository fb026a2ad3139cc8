"""What a breaker's transition tells people: one log line, and for a trip or a close one
alert (to the failure-group alerts' recipient: ``ALERT_HANDLER``, else ``mail_admins``).

Only the process whose conditional update won the transition calls this
(``breakers.state.step``), so each trip and each close is said once per cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.core.mail import mail_admins
from django.utils.module_loading import import_string

from ..conf import app_settings
from ..core.breaker import Breaker, State

logger = logging.getLogger("django_rmq_retry.breakers")

TRIPPED, CLOSED = "dependency down", "dependency back"


@dataclass(frozen=True)
class DependencyAlert:
    """What an alert handler gets for a breaker (it has ``kind`` and ``text`` like the
    failure-group ``Alert``)."""

    kind: str  # TRIPPED or CLOSED
    dependency: str
    reason: str
    by: str

    @property
    def text(self) -> str:
        if self.kind == TRIPPED:
            return (
                f"{self.kind}: {self.dependency}'s breaker opened ({self.reason}); the "
                "receivers that depend on it stop until a probe succeeds"
            )
        return f"{self.kind}: {self.dependency}'s breaker closed ({self.reason})"


def transition(name: str, before: Breaker, after: Breaker, by: str) -> None:
    """Say what changed (the winner of the transition calls this once)."""
    if before.state is after.state:
        return
    if after.state is State.HALF_OPEN:
        logger.info("dependency %s: half-open, %s probes (%s)", name, by, after.reason)
        return
    if after.state is State.OPEN and before.state is State.HALF_OPEN:
        logger.warning(
            "dependency %s: still down, next probe in %gs (%s)",
            name,
            after.probe_wait,
            after.reason,
        )
        return
    kind = TRIPPED if after.state is State.OPEN else CLOSED
    alert = DependencyAlert(kind, name, after.reason, by)
    logger.warning("%s", alert.text, extra={"dependency": name, "state": after.state.value})
    _send(alert)


def _send(alert: DependencyAlert) -> None:
    """To ``ALERT_HANDLER`` (it gets the alert), else a mail to the ADMINS titled for it."""
    try:
        if app_settings.ALERT_HANDLER:
            handler: Callable[[DependencyAlert], None] = import_string(app_settings.ALERT_HANDLER)
            handler(alert)
        elif settings.ADMINS:
            mail_admins(f"Dependency {alert.dependency}: {alert.kind}", alert.text)
        # else nobody receives alerts (check W003 says so); the log line stands
    except Exception:
        logger.exception("dependency alert not sent: %s", alert.text)
