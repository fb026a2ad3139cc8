"""The parked and outbox backlogs, read cheaply (no prometheus-client here: the web view
and the consumer's endpoint both use it)."""

from __future__ import annotations

from collections import Counter

from django.db.models import Sum
from django.utils import timezone

from ..models import OutboxMessage, OutboxStatus, ParkedGroupCount
from ..parking.group_counts import counts_kept


def parked_backlog() -> dict[tuple[str, str], int] | None:
    """Parked rows per (receiver, status), summed from the kept group counts (one small
    table, a row per failure group). ``None`` where the counts are not kept (a database
    without the triggers): counting the rows per scrape is what this must never do."""
    if not counts_kept():
        return None
    out: Counter[tuple[str, str]] = Counter()
    rows = ParkedGroupCount.objects.values_list("receiver", "status").annotate(n=Sum("count"))
    for receiver, status, n in rows:
        if n:
            out[(receiver, status)] += int(n)
    return dict(out)


def outbox_backlog() -> tuple[int, int, float]:
    """(pending rows, held rows, seconds the oldest pending row has waited). The rows are
    few unless the broker is away: counted along the (status, id) index."""
    pending = OutboxMessage.objects.filter(status=OutboxStatus.PENDING)
    # The first row by id is the oldest written: one step along the (status, id) index.
    oldest = pending.order_by("id").values_list("created_at", flat=True).first()
    age = max(0.0, (timezone.now() - oldest).total_seconds()) if oldest else 0.0
    return (
        pending.count(),
        OutboxMessage.objects.filter(status=OutboxStatus.HELD).count(),
        age,
    )
