"""Admin for per-key order: the held keys, each with its blocker, why it holds, and the
messages held behind it in their order (``parking.holds``).

View-only: a key is released by what releases its blocker (its retry succeeding, or an
operator requeuing or discarding the parked blocker in the parked messages' admin), never
by editing these rows.
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ..core.ordering import HoldState, held_reason
from ..models import HeldMessage, KeyHold
from .common import ViewOnly
from .preview import body_preview


class HeldMessageInline(ViewOnly, admin.TabularInline):
    model = HeldMessage
    fields = ("id", "message_id", "status", "held_at", "body_short")
    readonly_fields = fields
    ordering = ("id",)
    extra = 0
    can_delete = False
    verbose_name_plural = _("held messages, in the order they run once released")

    @admin.display(description=_("status"))
    def status(self, obj: HeldMessage) -> str:
        return "held"

    @admin.display(description=_("body"))
    def body_short(self, obj: HeldMessage) -> str:
        _kind, text, _shown = body_preview(
            bytes(obj.body), str((obj.properties or {}).get("content_type") or "")
        )
        return text[:200]


@admin.register(KeyHold)
class KeyHoldAdmin(ViewOnly, admin.ModelAdmin):
    list_display = ("key", "receiver", "state", "blocker", "held", "since", "changed_at")
    list_filter = ("state", "receiver")
    search_fields = ("=key", "=blocker")
    fields = ("receiver", "key", "queue", "state", "reason", "blocker", "parked_id", "since")
    readonly_fields = fields
    inlines = [HeldMessageInline]

    @admin.display(description=_("held messages"))
    def held(self, obj: KeyHold) -> int:
        return obj.messages.count()

    @admin.display(description=_("reason"))
    def reason(self, obj: KeyHold) -> str:
        return held_reason(obj.blocker, obj.key, HoldState(obj.state))
