"""What happens to parked rows after parking: discard (kept, marked) and purge (deleted),
in batches, and the failure-group summary the admin shows (from the kept counts of
:mod:`.group_counts` where the database keeps them)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db.models import Count, F, Max, Min, QuerySet, Sum
from django.utils import timezone

from .. import signals
from ..conf import app_settings
from ..db.batches import delete_in_batches
from ..models import ParkedGroupCount, ParkedMessage, ParkedStatus
from .claims import being_requeued
from .group_counts import counts_kept


def discard(
    queryset: QuerySet[ParkedMessage], *, user: str = "", batch_size: int | None = None
) -> int:
    """Mark parked rows discarded (kept for the record until purged). Returns the count."""
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    total = 0
    last_pk = 0
    base = (
        queryset.filter(status=ParkedStatus.PARKED)
        .exclude(being_requeued(queryset.db))
        .order_by("pk")
    )
    while True:
        ids = list(base.filter(pk__gt=last_pk).values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        last_pk = ids[-1]
        changed = (
            ParkedMessage.objects.using(queryset.db)
            .filter(pk__in=ids, status=ParkedStatus.PARKED)
            .exclude(being_requeued(queryset.db))
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
    wanted = [str(status) for status in statuses]
    qs = ParkedMessage.objects.using(using).filter(parked_at__lt=cutoff, status__in=wanted)
    if str(ParkedStatus.PARKED) in wanted:  # a row a requeue is publishing stays for its mark
        qs = qs.exclude(being_requeued(using))
    return qs.count() if dry_run else delete_in_batches(qs, batch_size)


def summary(
    queryset: QuerySet[ParkedMessage] | None = None,
    *,
    limit: int | None = None,
    using: str = "default",
) -> list[dict[str, Any]]:
    """Parked counts grouped by receiver and failure group (like ServicePulse's groups).

    Biggest first. Without a ``queryset``, on PostgreSQL and SQLite, read from the kept
    counts (a few rows per group, whatever the table's size; ``last`` is the latest
    parking into the group); otherwise the rows are grouped (and ``first`` is given too).
    """
    if queryset is None and counts_kept(using):
        kept = (
            ParkedGroupCount.objects.using(using)
            .filter(status=ParkedStatus.PARKED, count__gt=0)
            .order_by("-count", "receiver", "fingerprint", "error_type")
            .values("receiver", "fingerprint", "error_type", "count", last=F("last_parked_at"))
        )
        return list(kept if limit is None else kept[:limit])
    qs = queryset if queryset is not None else ParkedMessage.objects.using(using).all()
    grouped = (
        qs.filter(status=ParkedStatus.PARKED)
        .values("receiver", "fingerprint", "error_type")
        .annotate(count=Count("id"), first=Min("parked_at"), last=Max("parked_at"))
        .order_by("-count", "receiver")
    )
    return list(grouped if limit is None else grouped[:limit])


def parked_total(using: str = "default") -> int | None:
    """Rows parked now, from the kept counts; None where the database keeps none."""
    if not counts_kept(using):
        return None
    total = (
        ParkedGroupCount.objects.using(using)
        .filter(status=ParkedStatus.PARKED)
        .aggregate(total=Sum("count"))["total"]
    )
    return int(total or 0)
