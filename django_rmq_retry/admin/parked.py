"""The parked-message admin, assembled from its parts."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import path
from django.utils.translation import gettext_lazy as _

from ..models import ParkedMessage, ParkedStatus
from .changelist import CappedPaginator, ChangelistMixin, IndexedValuesFilter
from .dashboard import DashboardMixin
from .detail import DetailMixin
from .edit_page import EditMixin
from .filters import AttemptsFilter, FailedBetweenFilter, ParkedBetweenFilter
from .parked_actions import OperationsMixin


@admin.register(ParkedMessage)
class ParkedMessageAdmin(ChangelistMixin, DetailMixin, EditMixin, OperationsMixin, DashboardMixin):
    """View-only rows; requeue, republish and discard are actions with their own permission.

    Rows are never added or edited here, and never deleted either: *discard* keeps the row
    (with who discarded it) and ``manage.py rmq_purge_parked`` deletes old ones in batches.
    Django's bulk delete would also load every selected row for its confirmation page.
    """

    list_display = (
        # What an operator scans first comes first: at 1280 px nothing past the error is
        # cut off, and the long dotted names wrap after their dots.
        "id",
        "receiver_display",
        "status",
        "reason",
        "parked_at_display",
        "attempts",
        "error_type_display",
        "error_short",
        "routing_key",
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
        ParkedBetweenFilter,
        FailedBetweenFilter,
        AttemptsFilter,
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
    actions = (
        "requeue_selected",
        "requeue_in_background",
        "republish_to_topic",
        "discard_selected",
    )
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
                    "field_errors_display",
                    "error_type_detail",
                    "error_message_display",
                    "fingerprint",
                    ("attempts", "park_count", "requeue_count"),
                    ("first_failure_when", "last_failure_when", "parked_when"),
                    ("status_changed_when", "status_changed_by_display"),
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
        "field_errors_display",
        "error_type_detail",
        "error_message_display",
        "fingerprint",
        "attempts",
        "park_count",
        "requeue_count",
        "first_failure_when",
        "last_failure_when",
        "parked_when",
        "status_changed_when",
        "status_changed_by_display",
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

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        """The detail page, with Requeue and Discard buttons for those allowed to press them."""
        row = self.get_object(request, object_id)
        parked = row is not None and row.status == ParkedStatus.PARKED
        extra_context = {
            **(extra_context or {}),
            "can_requeue": parked and self.has_requeue_permission(request),
            "can_discard": parked and self.has_discard_permission(request),
            "can_edit": parked and self.has_edit_permission(request),
        }
        return super().change_view(request, object_id, form_url, extra_context)

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
                "dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="{}_{}_dashboard".format(*info),
            ),
            path(
                "<path:object_id>/edit/",
                self.admin_site.admin_view(self.edit_view),
                name="{}_{}_edit".format(*info),
            ),
            path(
                "<path:object_id>/requeue/",
                self.admin_site.admin_view(self.requeue_one_view),
                name="{}_{}_requeue_one".format(*info),
            ),
            path(
                "<path:object_id>/discard/",
                self.admin_site.admin_view(self.discard_one_view),
                name="{}_{}_discard_one".format(*info),
            ),
            path(
                "<path:object_id>/body/",
                self.admin_site.admin_view(self.body_view),
                name="{}_{}_body".format(*info),
            ),
        ]
        return extra + super().get_urls()
