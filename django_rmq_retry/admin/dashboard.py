"""The failure-groups page and the dashboard (counts kept by the database, never a scan
of the parked rows; the charts are inline SVG, no script, no CDN)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from .. import parking
from ..parking import snapshots
from ..parking.queries import group_query


class DashboardMixin(admin.ModelAdmin):
    # Extra views ----------------------------------------------------------------------------
    def summary_view(self, request: HttpRequest) -> TemplateResponse:
        """Parked counts by receiver and failure group; each row links to its rows."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        changelist = reverse(f"{self.admin_site.name}:django_rmq_retry_parkedmessage_changelist")
        groups = []
        for row in parking.summary(limit=500):
            query = group_query(row["receiver"], row["fingerprint"], row["error_type"])
            groups.append({**row, "url": f"{changelist}?{urlencode(query)}", "shell": _shell(row)})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Parked messages by failure group"),
            "groups": groups,
            "total": parking.parked_total() or sum(g["count"] for g in groups),
            "changelist_url": changelist,
        }
        return TemplateResponse(request, "django_rmq_retry/admin/parked_summary.html", context)

    def dashboard_view(self, request: HttpRequest) -> TemplateResponse:
        """Per failure group, parked and requeued counts over 24 h or 7 d (hourly points)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        span_name = request.GET.get("range", "24h")
        if span_name not in snapshots.RANGES:
            span_name = "24h"
        changelist = reverse(f"{self.admin_site.name}:django_rmq_retry_parkedmessage_changelist")
        charts = []
        for group in snapshots.series(snapshots.RANGES[span_name]):
            query = group_query(group.receiver, group.fingerprint, group.error_type)
            charts.append(
                {
                    "group": group,
                    "url": f"{changelist}?{urlencode(query)}",
                    **_chart(group.points),
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Dashboard: parked and requeued messages"),
            "charts": charts,
            "range": span_name,
            "ranges": list(snapshots.RANGES),
            "changelist_url": changelist,
        }
        return TemplateResponse(request, "django_rmq_retry/admin/dashboard.html", context)


def _shell(group: Mapping[str, Any]) -> str:
    """The same group from a shell: ``rmq_requeue``'s selection of it, counted."""
    return (
        f"python manage.py rmq_requeue --receiver {shlex.quote(group['receiver'])} "
        f"--group {shlex.quote(group['fingerprint'])} --dry-run"
    )


#: The chart's drawing box (the SVG scales to its container: a phone gets it narrower).
WIDTH, HEIGHT, PAD = 600, 120, 4


def _chart(points: list[tuple[datetime, int, int]]) -> dict[str, object]:
    """Polyline points of the parked and requeued lines, and the scale's top."""
    top = max([1, *(max(p, r) for _h, p, r in points)])
    n = max(1, len(points) - 1)

    def line(values: list[int]) -> str:
        return " ".join(
            f"{PAD + (WIDTH - 2 * PAD) * i / n:.1f},"
            f"{HEIGHT - PAD - (HEIGHT - 2 * PAD) * value / top:.1f}"
            for i, value in enumerate(values)
        )

    first, last = points[0] if points else None, points[-1] if points else None
    return {
        "parked_line": line([p for _h, p, _r in points]),
        "requeued_line": line([r for _h, _p, r in points]),
        "top": top,
        "width": WIDTH,
        "height": HEIGHT,
        "parked_now": last[1] if last else 0,
        "requeued_now": last[2] if last else 0,
        "since": first[0] if first else None,
    }
