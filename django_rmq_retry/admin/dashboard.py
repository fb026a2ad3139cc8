"""The failure-groups page (counts kept by the database, never a scan)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from .. import parking
from ..models import ParkedStatus


class DashboardMixin(admin.ModelAdmin):
    # Extra views ----------------------------------------------------------------------------
    def summary_view(self, request: HttpRequest) -> TemplateResponse:
        """Parked counts by receiver and failure group; each row links to its rows."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        changelist = reverse(f"{self.admin_site.name}:django_rmq_retry_parkedmessage_changelist")
        groups = []
        for row in parking.summary(limit=500):
            query = {
                "status__exact": ParkedStatus.PARKED,
                "receiver": row["receiver"],
                "fingerprint": row["fingerprint"],
                "error_type": row["error_type"],
            }
            groups.append({**row, "url": f"{changelist}?{urlencode(query)}"})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Parked messages by failure group"),
            "groups": groups,
            "total": parking.parked_total() or sum(g["count"] for g in groups),
            "changelist_url": changelist,
        }
        return TemplateResponse(request, "django_rmq_retry/admin/parked_summary.html", context)
