"""Admin for periodic tasks: schedules declared here, and those from the task backend's
``OPTIONS["periodic"]`` (read-only here: the settings own them, and each consumer syncs them
at start). The consumers step every enabled row; a row's tick counter and last result show
what they did."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..core.schedule import Cron, first_due
from ..models import PeriodicTask


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "task_path",
        "schedule",
        "enabled",
        "next_run_at",
        "last_run_at",
        "runs",
        "source",
    )
    list_filter = ("enabled", "source")
    search_fields = ("name", "task_path")
    fields = (
        ("name", "enabled"),
        ("task_path", "backend"),
        ("every_seconds", "cron"),
        "args",
        "kwargs",
        ("next_run_at", "last_run_at", "runs"),
        "last_result",
        "source",
    )
    readonly_fields = ("last_run_at", "runs", "last_result", "source")

    @admin.display(description=_("schedule"))
    def schedule(self, obj: PeriodicTask) -> str:
        return f"cron {obj.cron}" if obj.cron else f"every {obj.every_seconds:g} s"

    @admin.display(description=_("last result"))
    def last_result(self, obj: PeriodicTask) -> SafeString:
        if not obj.last_result_id:
            return format_html("{}", "—")
        url = reverse("admin:django_rmq_retry_taskresultrecord_change", args=[obj.last_result_id])
        return format_html('<a href="{}">{}</a>', url, obj.last_result_id)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and obj.source == PeriodicTask.SETTINGS:
            return [f.name for f in PeriodicTask._meta.fields if f.name != "id"] + ["last_result"]
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: PeriodicTask, form: Any, change: bool) -> None:
        """A new schedule, or one whose interval or cron changed, starts from now."""
        schedule_changed = not change or {"every_seconds", "cron"} & set(form.changed_data)
        if schedule_changed and "next_run_at" not in form.changed_data:
            cron = Cron.parse(obj.cron) if obj.cron else None
            obj.next_run_at = first_due(timezone.now(), every=obj.every_seconds, cron=cron)
        obj.source = PeriodicTask.ADMIN if not change else obj.source
        super().save_model(request, obj, form, change)
