"""The effective retry policy of a receiver: database row > code > settings.

Rows are read at most every ``POLICY_CACHE_SECONDS`` so an admin edit applies to running
consumers within that time, and a database outage falls back to the last rows seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError

from ..conf import app_settings
from ..core.backoff import Policy
from ..models import RetryPolicy
from . import Receiver

logger = logging.getLogger("django_rmq_retry.registry.policies")


_default: tuple[object, Policy] | None = None  # (the RETRY mapping it was built from, it)


def default_policy() -> Policy:
    """The ``RETRY`` setting as a policy, built once per settings value (a receiver without
    a policy of its own asks for it on every failure)."""
    global _default
    mapping = app_settings.RETRY  # the same object until the settings change
    if _default is None or _default[0] is not mapping:
        _default = (mapping, Policy.from_mapping(mapping))
    return _default[1]


class PolicyCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rows: dict[str, Policy] = {}
        self._loaded_at: float | None = None
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        ttl = float(app_settings.POLICY_CACHE_SECONDS)
        now = self._clock()
        if self._loaded_at is not None and now - self._loaded_at < ttl:
            return
        try:
            rows = {}
            for row in RetryPolicy.objects.filter(enabled=True):
                try:
                    rows[row.receiver] = row.to_policy()
                except ValueError as exc:
                    logger.error("ignoring invalid RetryPolicy for %s: %s", row.receiver, exc)
            self._rows = rows
        except DatabaseError as exc:
            logger.warning("cannot read retry policies (%s); using the last ones seen", exc)
        self._loaded_at = now

    def for_receiver(self, receiver: Receiver) -> Policy:
        with self._lock:
            self._refresh()
            row = self._rows.get(receiver.name)
        return row or receiver.policy or default_policy()

    def invalidate(self) -> None:
        with self._lock:
            self._loaded_at = None


policy_cache = PolicyCache()
