"""The parked-message detail page: body, failure, history, headers; the raw body view."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..conf import current_names
from ..core import history
from ..models import ParkedMessage, ParkedStatus
from .common import _error_type_label, _pretty, _when
from .preview import body_preview


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

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The field errors' row only on a row that has them (an invalid body's)."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None and obj.field_errors:
            return fieldsets
        return [
            (name, {**opts, "fields": [f for f in opts["fields"] if f != "field_errors_display"]})
            for name, opts in fieldsets
        ]

    @admin.display(description=_("field errors"))
    def field_errors_display(self, obj: ParkedMessage) -> SafeString | str:
        """An invalid body's failing fields (``schemas``), one row each."""
        return field_errors_table(obj.field_errors)

    @admin.display(description=_("traceback"))
    def traceback_display(self, obj: ParkedMessage) -> SafeString:
        return format_html('<pre class="rmq-pre">{}</pre>', obj.traceback or "—")

    @admin.display(description=_("headers"))
    def headers_display(self, obj: ParkedMessage) -> SafeString:
        return format_html('<pre class="rmq-pre">{}</pre>', _pretty(obj.headers or {}))

    @admin.display(description=_("AMQP properties"))
    def properties_display(self, obj: ParkedMessage) -> SafeString:
        return format_html('<pre class="rmq-pre">{}</pre>', _pretty(obj.properties or {}))

    @admin.display(description=_("history"))
    def history_display(self, obj: ParkedMessage) -> SafeString | str:
        """Every attempt (from the message's history header and each parking), then every
        park, requeue, edit and discard with who did it, in time order."""
        lines = timeline(obj)
        if not lines:
            return "—"
        rows = format_html_join(
            "",
            '<tr class="rmq-{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td></tr>",
            (
                (line.kind, _when(line.at), line.label, line.where, line.took, line.what, line.next)
                for line in lines
            ),
        )
        return format_html(
            '<table class="rmq-history"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            _("when"),
            _("what happened"),
            _("where / who"),
            _("took"),
            _("exception and first own frame / detail"),
            _("then"),
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


@dataclass(frozen=True)
class Line:
    """One line of a parked message's history."""

    at: datetime | None
    kind: str
    label: str
    where: str = ""
    took: str = ""
    what: str = ""
    next: str = ""


def _at(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        value = parse_datetime(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=dt_timezone.utc)  # our events are written in UTC
    return value


def _attempt_line(record: dict[str, str]) -> Line:
    return Line(
        _at(record.get("at")),
        "attempt",
        f"attempt {record.get('attempt', '?')}",
        record.get("where", ""),
        record.get("took", ""),
        record.get("what", ""),
        record.get("next", ""),
    )


def timeline(obj: ParkedMessage) -> list[Line]:
    """The attempts and the operator events of ``obj``, oldest first."""
    lines: list[Line] = []
    seen: set[str] = set()
    header = (obj.headers or {}).get(current_names().header("history"))
    for record in history.parse(header):
        key = repr(sorted(record.items()))
        if key not in seen:
            seen.add(key)
            lines.append(_attempt_line(record))
    for event in obj.history or []:
        if not isinstance(event, dict):
            continue
        last = event.get("attempt")
        if isinstance(last, str):
            for parsed in history.parse([last]):
                lines.append(_attempt_line(parsed))
        kind = str(event.get("event", ""))
        detail = event.get("diff") or " ".join(
            str(event[k]) for k in ("reason", "error_type") if event.get(k)
        )
        lines.append(
            Line(
                _at(event.get("at")),
                kind,
                kind,
                str(event.get("by", "")),
                "",
                str(detail),
                f"after {event['attempts']} attempt(s)" if event.get("attempts") else "",
            )
        )
    if obj.status in (ParkedStatus.REQUEUED, ParkedStatus.DISCARDED):
        # The current status's change (bulk requeues and discards do not write history).
        kind = str(obj.status)
        already = (
            lines and lines[-1].kind in (kind, "edited") and lines[-1].at == obj.status_changed_at
        )
        if not already:
            lines.append(Line(obj.status_changed_at, kind, kind, obj.status_changed_by))
    epoch = datetime.min.replace(tzinfo=dt_timezone.utc)
    return sorted(lines, key=lambda line: _aware(line.at) or epoch)


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=dt_timezone.utc)
    return value


def field_errors_table(errors: Any) -> SafeString | str:
    """``[{"loc": [...], "msg": ...}]`` as a table (the detail page, the edit page)."""
    if not errors or not isinstance(errors, list):
        return "—"
    rows = format_html_join(
        "",
        "<tr><td><code>{}</code></td><td>{}</td></tr>",
        (
            (
                ".".join(str(p) for p in (e.get("loc") or [])) or _("(the whole body)"),
                e.get("msg", ""),
            )
            for e in errors
            if isinstance(e, dict)
        ),
    )
    return format_html(
        '<table class="rmq-field-errors"><thead><tr><th>{}</th><th>{}</th></tr></thead>'
        "<tbody>{}</tbody></table>",
        _("field"),
        _("what is wrong"),
        rows,
    )
