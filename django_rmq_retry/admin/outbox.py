"""Admin for the outbox: what waits to be published, and the rows the broker kept refusing
(held for an operator: unroutable because no consumer declared the topic's queue, ...).

Rows are read-only; "publish again" calls ``outbox.release_held`` (as ``rmq_relay
--release-held`` does), and deleting a row drops its message for good.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..models import OutboxMessage
from ..outbox import release_held
from .preview import body_preview


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "routing_key",
        "message_id",
        "status",
        "attempts",
        "error_short",
        "created_at",
        "available_at",
    )
    list_filter = ("status", "routing_key")
    search_fields = ("=message_id", "=routing_key")
    show_full_result_count = False
    actions = ["publish_again"]
    fields = (
        ("routing_key", "exchange"),
        ("message_id", "group"),
        ("status", "attempts"),
        ("created_at", "available_at"),
        "last_error",
        "body_display",
        "properties",
    )
    readonly_fields = tuple(
        name for entry in fields for name in (entry if isinstance(entry, tuple) else (entry,))
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("last error"))
    def error_short(self, obj: OutboxMessage) -> str:
        return Truncator(obj.last_error).chars(80)

    @admin.display(description=_("body"))
    def body_display(self, obj: OutboxMessage) -> str:
        props = obj.properties or {}
        _kind, text, _shown = body_preview(
            bytes(obj.body), props.get("content_type") or "", props.get("content_encoding")
        )
        return text

    @admin.action(description=_("Publish again now (held or waiting rows)"), permissions=["delete"])
    def publish_again(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        count = release_held(queryset)
        self.message_user(
            request,
            ngettext(
                "%(count)d message will be published by the relay.",
                "%(count)d messages will be published by the relay.",
                count,
            )
            % {"count": count},
            messages.SUCCESS,
        )
