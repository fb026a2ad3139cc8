"""Hourly snapshots of the failure-group counts, for the dashboard's charts.

The database keeps :class:`~django_rmq_retry.models.ParkedGroupCount` exact (triggers);
this copies its parked and requeued counts into the current hour's
:class:`~django_rmq_retry.models.ParkedGroupSnapshot` rows (the consumers' operations
thread, every ``SNAPSHOT_EVERY`` seconds: the last point of a chart is at most that old),
and drops snapshots older than ``KEEP``. A chart of 7 days reads at most 168 rows a group;
nothing here reads the parked table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from ..models import ParkedGroupCount, ParkedGroupSnapshot, ParkedStatus

SNAPSHOT_EVERY = 60.0
KEEP = timedelta(days=8)
RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}


def _hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def take(now: datetime | None = None) -> int:
    """Write the current hour's snapshot of every group; how many groups."""
    now = now or timezone.now()
    hour = _hour(now)
    counts: dict[tuple[str, str, str], dict[str, int]] = defaultdict(dict)
    for row in ParkedGroupCount.objects.filter(
        status__in=(ParkedStatus.PARKED, ParkedStatus.REQUEUED)
    ):
        counts[(row.receiver, row.fingerprint, row.error_type)][row.status] = row.count
    with transaction.atomic():
        for (receiver, fingerprint, error_type), by_status in counts.items():
            ParkedGroupSnapshot.objects.update_or_create(
                hour=hour,
                receiver=receiver,
                fingerprint=fingerprint,
                error_type=error_type,
                defaults={
                    "parked": by_status.get("parked", 0),
                    "requeued": by_status.get("requeued", 0),
                },
            )
        ParkedGroupSnapshot.objects.filter(hour__lt=hour - KEEP).delete()
    return len(counts)


@dataclass(frozen=True)
class GroupSeries:
    receiver: str
    fingerprint: str
    error_type: str
    #: (hour, parked, requeued), one per hour of the span, oldest first.
    points: list[tuple[datetime, int, int]]

    @property
    def parked_now(self) -> int:
        return self.points[-1][1] if self.points else 0


def series(span: timedelta, *, now: datetime | None = None, groups: int = 20) -> list[GroupSeries]:
    """The ``groups`` largest groups (by parked rows now), one point per hour of ``span``;
    hours without a snapshot repeat the last known point."""
    now = now or timezone.now()
    end = _hour(now)
    start = end - span
    rows = ParkedGroupSnapshot.objects.filter(hour__gte=start).order_by("hour")
    by_group: dict[tuple[str, str, str], dict[datetime, tuple[int, int]]] = defaultdict(dict)
    for row in rows:
        by_group[(row.receiver, row.fingerprint, row.error_type)][row.hour] = (
            row.parked,
            row.requeued,
        )
    hours = [start + timedelta(hours=i) for i in range(int(span / timedelta(hours=1)) + 1)]
    out = []
    for key, points in by_group.items():
        last = (0, 0)
        line = []
        for hour in hours:
            last = points.get(hour, last)
            line.append((hour, *last))
        out.append(GroupSeries(*key, points=line))
    out.sort(key=lambda g: -g.parked_now)
    return out[:groups]
