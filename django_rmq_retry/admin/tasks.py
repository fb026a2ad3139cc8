"""Admin for ``django.tasks`` results (``RabbitMQBackend``): view-only rows, each attempt's
error, and a link to the parked message of a task that ran out of attempts (requeue it
there, like any parked message)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import ParkedMessage, TaskResultRecord


@admin.register(TaskResultRecord)
class TaskResultRecordAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "task_path",
        "queue_name",
        "status",
        "attempts",
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("status", "queue_name")
    search_fields = ("=id", "task_path")
    date_hierarchy = "enqueued_at"
    show_full_result_count = False
    fields = (
        ("id", "status"),
        ("task_path", "queue_name", "priority"),
        ("enqueued_at", "run_after"),
        ("started_at", "last_attempted_at", "finished_at"),
        "arguments",
        "return_value_display",
        "attempt_errors",
        "worker_ids",
        "parked_link",
    )
    readonly_fields = tuple(
        name for entry in fields for name in (entry if isinstance(entry, tuple) else (entry,))
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("attempts"))
    def attempts(self, obj: TaskResultRecord) -> int:
        return len(obj.worker_ids or [])

    @admin.display(description=_("arguments"))
    def arguments(self, obj: TaskResultRecord) -> SafeString:
        text = json.dumps({"args": obj.args, "kwargs": obj.kwargs}, indent=2, default=str)
        return format_html("<pre>{}</pre>", text)

    @admin.display(description=_("return value"))
    def return_value_display(self, obj: TaskResultRecord) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(obj.return_value, indent=2, default=str))

    @admin.display(description=_("errors (one per failed attempt)"))
    def attempt_errors(self, obj: TaskResultRecord) -> SafeString:
        errors = obj.errors or []
        if not errors:
            return format_html("{}", "—")
        return format_html_join(
            "",
            "<p><strong>{}. {}</strong></p><pre>{}</pre>",
            (
                (n, e.get("exception_class_path", "?"), e.get("traceback", ""))
                for n, e in enumerate(errors, 1)
            ),
        )

    @admin.display(description=_("parked message"))
    def parked_link(self, obj: TaskResultRecord) -> SafeString:
        row = ParkedMessage.objects.filter(message_id=obj.id).order_by("-id").first()
        if row is None:
            return format_html("{}", "—")
        url = reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk])
        return format_html('<a href="{}">{} ({})</a>', url, row.pk, row.get_status_display())
