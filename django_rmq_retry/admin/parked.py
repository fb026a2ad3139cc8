"""The parked-message admin, assembled from its parts."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import path
from django.utils.translation import gettext_lazy as _

from ..models import ParkedMessage
from .changelist import CappedPaginator, ChangelistMixin, IndexedValuesFilter
from .dashboard import DashboardMixin
from .detail import DetailMixin
from .operations import OperationsMixin


@admin.register(ParkedMessage)
class ParkedMessageAdmin(ChangelistMixin, DetailMixin, OperationsMixin, DashboardMixin):
    """View-only rows; requeue, republish and discard are actions with their own permission.

    Rows are never added or edited here, and never deleted either: *discard* keeps the row
    (with who discarded it) and ``manage.py rmq_purge_parked`` deletes old ones in batches.
    Django's bulk delete would also load every selected row for its confirmation page.
    """

    list_display = (
        "id",
        "receiver_display",
        "routing_key",
        "error_type_display",
        "error_short",
        "attempts",
        "status",
        "reason",
        "parked_at",
    )
    list_display_links = ("id", "receiver_display")
    list_filter = (
        "status",
        "reason",
        ("receiver", IndexedValuesFilter),
        ("queue", IndexedValuesFilter),
        ("error_type", IndexedValuesFilter),
        ("fingerprint", IndexedValuesFilter),
        "parked_at",
    )
    # No date_hierarchy: its links cost a scan of the table (MIN/MAX, then DISTINCT dates);
    # the parked_at filter's fixed ranges cost nothing to show.
    search_fields = ("message_id", "correlation_id", "error_message")  # see get_search_results
    search_help_text = _(
        "Exact message id or correlation id, or whole words from the error message."
    )
    list_per_page = 50
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # "Show counts" counted every filter's every value
    actions = ("requeue_selected", "republish_to_topic", "discard_selected")
    change_list_template = "django_rmq_retry/admin/parkedmessage_change_list.html"
    change_form_template = "django_rmq_retry/admin/parkedmessage_change_form.html"

    fieldsets = (
        (
            _("Message"),
            {
                "fields": (
                    "receiver",
                    "queue",
                    ("exchange", "routing_key"),
                    ("message_id", "correlation_id"),
                    ("content_type", "body_size"),
                    "body_display",
                )
            },
        ),
        (
            _("Failure"),
            {
                "fields": (
                    ("status", "reason"),
                    "reason_detail",
                    "error_type",
                    "error_message_display",
                    "fingerprint",
                    ("attempts", "park_count", "requeue_count"),
                    ("first_failure_at", "last_failure_at", "parked_at"),
                    ("status_changed_at", "status_changed_by"),
                    "traceback_display",
                )
            },
        ),
        (_("History"), {"fields": ("history_display",)}),
        (_("Headers and properties"), {"fields": ("headers_display", "properties_display")}),
    )
    readonly_fields = (
        "receiver",
        "queue",
        "exchange",
        "routing_key",
        "message_id",
        "correlation_id",
        "content_type",
        "body_size",
        "body_display",
        "status",
        "reason",
        "reason_detail",
        "error_type",
        "error_message_display",
        "fingerprint",
        "attempts",
        "park_count",
        "requeue_count",
        "first_failure_at",
        "last_failure_at",
        "parked_at",
        "status_changed_at",
        "status_changed_by",
        "traceback_display",
        "history_display",
        "headers_display",
        "properties_display",
    )

    # Permissions ----------------------------------------------------------------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rmq_retry.requeue_parkedmessage")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rmq_retry.discard_parkedmessage")

    # URLs -----------------------------------------------------------------------------------
    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        extra = [
            path(
                "summary/",
                self.admin_site.admin_view(self.summary_view),
                name="{}_{}_summary".format(*info),
            ),
            path(
                "<path:object_id>/body/",
                self.admin_site.admin_view(self.body_view),
                name="{}_{}_body".format(*info),
            ),
        ]
        return extra + super().get_urls()
