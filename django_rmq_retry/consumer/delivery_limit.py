"""Delivery-limit bookkeeping: park a message that keeps killing the consumer.

A receiver that takes the process down (``os._exit``, a segfault in a C extension, the OOM
killer) never returns, so no retry or park happens: the broker redelivers the message to the
next consumer, which dies too. Every queue type counts *receiver starts* of a redelivered
message in a ``DeliveryStart`` row that lives only while the message is being handled; past
``DELIVERY_LIMIT`` starts it is parked (reason *delivery_limit*) instead of run again.

A quorum queue's ``x-delivery-count`` is not enough on its own: it also counts deliveries
that sat unstarted in the prefetch window of a consumer that died, so a poison message would
take its innocent neighbours down with it. It only serves when the database cannot be written.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import DatabaseError
from django.db.models import F

from ..core.envelope import delivery_digest
from ..core.names import Names
from ..core.outcome import Park, ParkReason
from ..models import DeliveryStart
from .actions import Delivery

logger = logging.getLogger("django_rmq_retry.consumer")


class DeliveryLimit:
    """Counts receiver starts of redelivered messages (see the module docstring)."""

    def __init__(self, names: Names, limit: int, *, broker_counts: bool) -> None:
        self.names = names
        self.limit = limit
        #: Only a quorum queue sets x-delivery-count; on a classic queue the header can only
        #: come from the publisher, and a forged one must not park a healthy message.
        self.broker_counts = broker_counts

    def applies(self, d: Delivery, headers: Mapping[str, Any]) -> bool:
        """Whether to count this delivery: only one the broker has delivered before."""
        return d.redelivered or (self.broker_counts and "x-delivery-count" in headers)

    def check(self, d: Delivery, headers: Mapping[str, Any]) -> tuple[str | None, Park | None]:
        """Count this start; returns the row's key (to forget later) and a ``Park`` past the limit."""
        limit = self.limit
        broker_count = headers.get("x-delivery-count") if self.broker_counts else None
        if not isinstance(broker_count, int) or isinstance(broker_count, bool):
            broker_count = None
        key = delivery_digest(
            d.queue,
            d.properties.get("message_id"),
            d.body,
            str(headers.get(self.names.header("attempt"))),
            str(headers.get(self.names.header("requeued"))),
        )
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
        if row.starts >= limit:
            return key, Park(
                ParkReason.DELIVERY_LIMIT,
                f"the consumer died {row.starts} times while handling it (limit {limit})",
            )
        return key, None

    def forget(self, keys: Iterable[str | None]) -> None:
        """The receivers of these deliveries returned (or they were parked): stop counting."""
        keys = [k for k in keys if k]
        if not keys:
            return
        try:
            DeliveryStart.objects.filter(key__in=keys).delete()
        except DatabaseError:
            logger.debug("could not clear %d delivery start(s)", len(keys), exc_info=True)
