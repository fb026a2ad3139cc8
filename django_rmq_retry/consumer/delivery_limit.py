"""Delivery-limit bookkeeping: the give-back budget (``core.budget``) of each message.

A receiver that takes the process down (``os._exit``, a segfault in a C extension, the OOM
killer) never returns, so no retry or park happens: the broker redelivers the message to the
next consumer, which dies too. Every queue type counts *receiver starts* of a redelivered
message in a ``DeliveryStart`` row that lives only while the message is being handled; past
``DELIVERY_LIMIT`` starts it is parked (reason *delivery_limit*) instead of run again.

A quorum queue's ``x-delivery-count`` is not enough on its own: it also counts deliveries
that sat unstarted in the prefetch window of a consumer that died, so a poison message would
take its innocent neighbours down with it. It only serves when the database cannot be written.

The row is not only about crashes: it lives until the delivery is *settled* (acked after the
receiver returned, after its retry copy was confirmed, or after its row was parked), so
every other give-back — a retry copy the broker refused, a channel closed under a slow
receiver, a row the database refused — counts too, and no loop outlives the limit. Why a
delivery was given back is remembered in memory (:meth:`DeliveryLimit.note`) so that the
parked row names the cause when this process saw it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import DatabaseError
from django.db.models import F

from ..core.budget import over_budget
from ..core.envelope import delivery_digest
from ..core.names import Names
from ..core.outcome import Park, ParkReason
from ..models import DeliveryStart
from .actions import Delivery

logger = logging.getLogger("django_rmq_retry.consumer")

#: Give-back causes remembered at most (oldest forgotten first): a bound on memory, not on
#: correctness — a forgotten cause only makes the parked row's reason less precise.
MAX_CAUSES = 10_000


class DeliveryLimit:
    """Counts receiver starts of redelivered messages (see the module docstring)."""

    def __init__(self, names: Names, limit: int, *, broker_counts: bool) -> None:
        self.names = names
        self.limit = limit
        #: Only a quorum queue sets x-delivery-count; on a classic queue the header can only
        #: come from the publisher, and a forged one must not park a healthy message.
        self.broker_counts = broker_counts
        self._causes: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def applies(self, d: Delivery, headers: Mapping[str, Any]) -> bool:
        """Whether to count this delivery: only one the broker has delivered before."""
        return d.redelivered or (self.broker_counts and "x-delivery-count" in headers)

    def key(self, d: Delivery) -> str:
        """The message's identity across redeliveries (its attempt and requeue included)."""
        return delivery_digest(*self.local_key(d))

    def local_key(self, d: Delivery) -> tuple[str, str, bytes, str, str]:
        """The parts :meth:`key` digests, for this process's own bookkeeping (a delivery of
        a message whose run goes on, ``consumer.overruns``): used as they are, so the
        loop's thread hashes nothing per delivery; exact, and never stored."""
        headers = d.properties.get("headers") or {}
        return (
            d.queue,
            str(d.properties.get("message_id") or ""),
            d.body,
            str(headers.get(self.names.header("attempt"))),
            str(headers.get(self.names.header("requeued"))),
        )

    def note(self, d: Delivery, cause: str) -> None:
        """Remember why ``d`` goes back to its queue (any thread; no database)."""
        key = self.key(d)
        with self._lock:
            self._causes[key] = cause
            self._causes.move_to_end(key)
            while len(self._causes) > MAX_CAUSES:
                self._causes.popitem(last=False)

    def _cause(self, key: str) -> str | None:
        with self._lock:
            return self._causes.get(key)

    def check(self, d: Delivery, headers: Mapping[str, Any]) -> tuple[str | None, Park | None]:
        """Count this start; returns the row's key (to forget later) and a ``Park`` past the limit."""
        limit = self.limit
        broker_count = headers.get("x-delivery-count") if self.broker_counts else None
        if not isinstance(broker_count, int) or isinstance(broker_count, bool):
            broker_count = None
        key = self.key(d)
        try:
            row, created = DeliveryStart.objects.get_or_create(
                key=key,
                defaults={
                    "queue": d.queue[:255],
                    "starts": 1,
                    "message_id": str(d.properties.get("message_id") or "")[:255],
                },
            )
            if not created:
                DeliveryStart.objects.filter(pk=row.pk).update(starts=F("starts") + 1)
                row.refresh_from_db()
        except DatabaseError as exc:
            if broker_count is not None and broker_count >= limit:
                return None, Park(
                    ParkReason.DELIVERY_LIMIT,
                    f"delivered {broker_count + 1} times without finishing (limit {limit})",
                )
            logger.warning(
                "cannot record delivery start (%s); running without the delivery limit", exc
            )
            return None, None
        return key, over_budget(row.starts, limit, self._cause(key))

    def forget(self, keys: Iterable[str | None]) -> None:
        """These deliveries are settled (acked, or their row parked): stop counting."""
        present = [k for k in keys if k]
        if not present:
            return
        with self._lock:
            for k in present:
                self._causes.pop(k, None)
        try:
            DeliveryStart.objects.filter(key__in=present).delete()
        except DatabaseError:
            logger.debug("could not clear %d delivery start(s)", len(present), exc_info=True)
