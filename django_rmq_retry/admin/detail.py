"""The parked-message detail page: body, failure, history, headers; the raw body view."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import ParkedMessage, ParkedStatus
from ..preview import body_preview
from .common import _error_type_label, _pretty, _when


class DetailMixin(admin.ModelAdmin):
    """The detail page's fields and its two buttons (requeue, discard this message)."""

    # Times with seconds ---------------------------------------------------------------------
    @admin.display(description=_("first failure"))
    def first_failure_when(self, obj: ParkedMessage) -> str:
        return _when(obj.first_failure_at)

    @admin.display(description=_("last failure"))
    def last_failure_when(self, obj: ParkedMessage) -> str:
        return _when(obj.last_failure_at)

    @admin.display(description=_("parked at"))
    def parked_when(self, obj: ParkedMessage) -> str:
        return _when(obj.parked_at)

    @admin.display(description=_("status changed"))
    def status_changed_when(self, obj: ParkedMessage) -> str:
        return _when(obj.status_changed_at or obj.parked_at)

    @admin.display(description=_("changed by"))
    def status_changed_by_display(self, obj: ParkedMessage) -> str:
        """Who put the row in its status: an operator, or the consumer that parked it."""
        if obj.status_changed_by:
            return obj.status_changed_by
        if obj.status == ParkedStatus.PARKED:
            return str(_("the consumer (parked after the last attempt)"))
        return str(_("unknown"))

    @admin.display(description=_("error type"))
    def error_type_detail(self, obj: ParkedMessage) -> SafeString | str:
        return _error_type_label(obj.error_type) if obj.error_type else "—"

    # Detail fields --------------------------------------------------------------------------
    @admin.display(description=_("body"))
    def body_display(self, obj: ParkedMessage) -> SafeString:
        body = bytes(obj.body or b"")
        encoding = (obj.properties or {}).get("content_encoding")
        kind, text, shown = body_preview(
            body, obj.content_type, encoding if isinstance(encoding, str) else None
        )
        labels = {
            "json": _("JSON"),
            "text": _("text"),
            "hex": _("binary, hex dump"),
            "empty": _("empty body"),
        }
        note = f"{labels[kind]} · {len(body)} bytes"
        if shown < len(body):
            note += f" · showing the first {shown} bytes"
        download = reverse(
            f"{self.admin_site.name}:django_rmq_retry_parkedmessage_body", args=[obj.pk]
        )
        return format_html(
            '<div class="rmq-note">{} · <a href="{}">{}</a></div><pre class="rmq-pre rmq-body">{}</pre>',
            note,
            download,
            _("download the raw body"),
            text,
        )

    @admin.display(description=_("error message"))
    def error_message_display(self, obj: ParkedMessage) -> SafeString:
        return format_html('<pre class="rmq-pre">{}</pre>', obj.error_message)

    @admin.display(description=_("traceback"))
    def traceback_display(self, obj: ParkedMessage) -> SafeString:
        return format_html('<pre class="rmq-pre">{}</pre>', obj.traceback or "—")

    @admin.display(description=_("headers"))
    def headers_display(self, obj: ParkedMessage) -> SafeString:
        return format_html('<pre class="rmq-pre">{}</pre>', _pretty(obj.headers or {}))

    @admin.display(description=_("AMQP properties"))
    def properties_display(self, obj: ParkedMessage) -> SafeString:
        return format_html('<pre class="rmq-pre">{}</pre>', _pretty(obj.properties or {}))

    @admin.display(description=_("failure history"))
    def history_display(self, obj: ParkedMessage) -> SafeString | str:
        events = [e for e in (obj.history or []) if isinstance(e, dict)]
        if not events:
            return "—"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    e.get("at", ""),
                    e.get("event", ""),
                    e.get("reason", ""),
                    e.get("error_type", ""),
                    e.get("attempts", ""),
                )
                for e in events
            ),
        )
        return format_html(
            "<table><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>"
            "</thead><tbody>{}</tbody></table>",
            _("when"),
            _("event"),
            _("reason"),
            _("error type"),
            _("attempts"),
            rows,
        )

    def body_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The raw body as a download (never rendered inline by the browser)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        row = get_object_or_404(ParkedMessage, pk=object_id)
        response = HttpResponse(bytes(row.body or b""), content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="parked-{row.pk}.bin"'
        response["X-Content-Type-Options"] = "nosniff"
        return response
