"""What happens to parked rows after parking: discard (kept, marked) and purge (deleted),
in batches, and the failure-group summary the admin shows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db.models import Count, Max, Min, QuerySet
from django.utils import timezone

from .. import signals
from ..conf import app_settings
from ..models import ParkedMessage, ParkedStatus


def discard(
    queryset: QuerySet[ParkedMessage], *, user: str = "", batch_size: int | None = None
) -> int:
    """Mark parked rows discarded (kept for the record until purged). Returns the count."""
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    total = 0
    last_pk = 0
    base = queryset.filter(status=ParkedStatus.PARKED).order_by("pk")
    while True:
        ids = list(base.filter(pk__gt=last_pk).values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        last_pk = ids[-1]
        changed = (
            ParkedMessage.objects.using(queryset.db)
            .filter(pk__in=ids, status=ParkedStatus.PARKED)
            .update(
                status=ParkedStatus.DISCARDED,
                status_changed_at=timezone.now(),
                status_changed_by=user[:150],
            )
        )
        total += changed
        if changed:
            signals.message_discarded.send_robust(
                sender="django_rmq_retry", parked_ids=ids, user=user
            )
    return total


def purge(
    older_than: timedelta,
    *,
    statuses: Iterable[str] = (str(ParkedStatus.REQUEUED), str(ParkedStatus.DISCARDED)),
    batch_size: int | None = None,
    dry_run: bool = False,
    using: str = "default",
) -> int:
    """Delete rows parked before now - ``older_than`` with one of ``statuses``, in batches."""
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    cutoff = timezone.now() - older_than
    qs = ParkedMessage.objects.using(using).filter(parked_at__lt=cutoff, status__in=list(statuses))
    if dry_run:
        return qs.count()
    total = 0
    while True:
        ids = list(qs.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return total
        total += ParkedMessage.objects.using(using).filter(pk__in=ids).delete()[0]


def summary(queryset: QuerySet[ParkedMessage] | None = None) -> list[dict[str, Any]]:
    """Parked counts grouped by receiver and failure group (like ServicePulse's groups)."""
    qs = queryset if queryset is not None else ParkedMessage.objects.all()
    return list(
        qs.filter(status=ParkedStatus.PARKED)
        .values("receiver", "fingerprint", "error_type")
        .annotate(count=Count("id"), first=Min("parked_at"), last=Max("parked_at"))
        .order_by("-count", "receiver")
    )
