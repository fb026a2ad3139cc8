"""Admin for parked messages (view-only rows, permission-gated actions) and retry policies.

Every action calls the service functions in :mod:`django_rmq_retry.parking`, the same ones
``manage.py rmq_requeue`` uses; nothing here talks to the broker or decides anything itself.
Everything shown from a message (body, headers, errors) goes through Django's escaping.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.views.main import SEARCH_VAR
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db import connections, transaction
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from . import parking
from .core.errors import RmqRetryError
from .models import ParkedMessage, ParkedStatus, RetryPolicy
from .parking import WordsMatch, distinct_values
from .parking.newest import newest_first_ids
from .preview import body_preview
from .registry import default_registry

logger = logging.getLogger("django_rmq_retry.admin")

_View = TypeVar("_View", bound=Callable[..., Any])


def _outside_request_transactions(view: _View) -> _View:
    """``transaction.non_atomic_requests`` for every configured database."""
    for alias in connections:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


#: Query-string keys of the changelist that are not filters.
_NOT_FILTERS = frozenset({"p", "o", "e", "_changelist_filters", "_to_field", "_popup"})


def _pretty(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _filter_description(request: HttpRequest) -> str:
    parts = [
        f"{key}={','.join(values)}"
        for key, values in sorted(request.GET.lists())
        if key not in _NOT_FILTERS
    ]
    return "; ".join(parts) if parts else "none"


def _breakable(dotted: str) -> SafeString:
    """A dotted path the browser may wrap after each dot (each part escaped)."""
    parts = dotted.split(".")
    return format_html_join(mark_safe(".<wbr>"), "{}", ((part,) for part in parts))


# --------------------------------------------------------------------------------------------
# Parked messages: pages that do not grow with the table (#16)

#: Counts stop here: the list says "10,000+" rather than count millions of rows per page.
COUNT_CAP = 10_000
#: Values a sidebar filter lists (the first ones in order).
FILTER_VALUES_CAP = 100


class _AtLeast(int):
    """A count that stopped at its cap: compares as cap + 1, prints as ``10,000+``."""

    def __str__(self) -> str:
        return f"{int(self) - 1:,}+"


def _capped_count(qs: QuerySet[Any], cap: int) -> int:
    """The rows of ``qs`` counted up to ``cap`` + 1 (an :class:`_AtLeast` past ``cap``)."""
    found = qs.order_by()[: cap + 1].count()
    return _AtLeast(found) if found > cap else found


class CappedPaginator(Paginator):
    """Counts the matching rows up to :data:`COUNT_CAP` + 1, never the whole table.

    The pages go as deep as the cap (row 10,000 is on page 200 at 50 a page); past it, a
    filter or a search narrows the list. With ``sliced`` (a search), a page's rows are found
    by :func:`~django_rmq_retry.parking.newest.newest_first_ids`, then read by id: the same
    rows in the same order, without walking the rows the search rules out.
    """

    cap = COUNT_CAP
    sliced = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return super().count
        return _capped_count(qs, self.cap)

    def page(self, number: Any) -> Page:
        qs = self.object_list
        if not (self.sliced and isinstance(qs, QuerySet)):
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:  # as Paginator.page
            top = self.count
        total = None if isinstance(self.count, _AtLeast) else self.count
        ids = newest_first_ids(qs, top, total)
        if ids is None:
            return super().page(number)
        return Page(qs.filter(pk__in=ids[bottom:top]), number, self)


class IndexedValuesFilter(admin.AllValuesFieldListFilter):
    """A sidebar filter listing a column's values without ``SELECT DISTINCT`` over the table.

    The values come from the column's index, one probe per value (:func:`distinct_values`),
    and at most :data:`FILTER_VALUES_CAP` of them; any other value still filters through the
    URL (the failure-groups page links that way).
    """

    def __init__(
        self, field: Any, request: Any, params: Any, model: Any, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(field, request, params, model, *args, **kwargs)
        self.lookup_choices = distinct_values(  # type: ignore[assignment]
            model, field.name, FILTER_VALUES_CAP, using=self.lookup_choices.db
        )


@admin.register(ParkedMessage)
class ParkedMessageAdmin(admin.ModelAdmin):
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

    #: Seconds a requeue action may take, the page's answer included: the run stops at a
    #: batch boundary and reports what is left (running it again continues; nothing is
    #: requeued twice). None: no limit. Keep it under your server's request timeout
    #: (gunicorn's default is 30 s).
    requeue_time_budget: float | None = 20.0
    #: Seconds of that budget kept for what follows the run's deadline: the batches in
    #: flight confirmed and marked, the claims released, the capped count of what is left.
    #: At 1,000,000 rows (``bench/scale.py --bulk``, 2026-11-25) the run ended 2.3 s past its
    #: deadline and an uncapped count took 2.8 s: a 20-second budget made a 25-second click.
    requeue_end_reserve: float = 5.0

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

    # Querysets ------------------------------------------------------------------------------
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> Any:
        base = super().get_changelist(request, **kwargs)

        class ParkedChangeList(base):  # type: ignore[misc, valid-type]
            def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
                # The list never needs the heavy columns; the actions reload what they use.
                qs = super().get_queryset(request, exclude_parameters)
                return qs.defer("body", "traceback", "properties", "headers", "history")

        return ParkedChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[ParkedMessage],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Any:
        paginator = super().get_paginator(
            request, queryset, per_page, orphans, allow_empty_first_page
        )
        if isinstance(paginator, CappedPaginator):
            # A search's words may match none of the newest rows: see newest_first_ids.
            paginator.sliced = bool(request.GET.get(SEARCH_VAR, "").strip())
        return paginator

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ParkedMessage], search_term: str
    ) -> tuple[QuerySet[ParkedMessage], bool]:
        """A message id or correlation id, exactly; or every word, in the error message.

        Each part uses an index: the ids their b-trees, the words PostgreSQL's full-text
        index (whole words, any case; elsewhere a scan, see :class:`WordsMatch`).
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        matches = Q(message_id=term) | Q(correlation_id=term) | WordsMatch("error_message", term)
        return queryset.filter(matches), False

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

    @_outside_request_transactions
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """The list and its actions, never inside an ``ATOMIC_REQUESTS`` transaction.

        A requeue publishes each row and then marks it requeued: inside the request's
        transaction the marks would commit only when the whole view returns, after the
        copies were published (a copy failing fast would meet a row not yet requeued, and
        the claims of a long requeue would hold the table). Each service commits its own
        steps instead.
        """
        extra_context = {
            **(extra_context or {}),
            "summary_url": reverse(
                f"{self.admin_site.name}:django_rmq_retry_parkedmessage_summary"
            ),
        }
        return super().changelist_view(request, extra_context)

    # List columns ---------------------------------------------------------------------------
    @admin.display(description=_("receiver"), ordering="receiver")
    def receiver_display(self, obj: ParkedMessage) -> SafeString:
        return _breakable(obj.receiver)

    @admin.display(description=_("error type"), ordering="error_type")
    def error_type_display(self, obj: ParkedMessage) -> SafeString:
        return _breakable(obj.error_type)

    @admin.display(description=_("error"))
    def error_short(self, obj: ParkedMessage) -> str:
        return Truncator(obj.error_message).chars(80)

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

    def body_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The raw body as a download (never rendered inline by the browser)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        row = get_object_or_404(ParkedMessage, pk=object_id)
        response = HttpResponse(bytes(row.body or b""), content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="parked-{row.pk}.bin"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    # Actions --------------------------------------------------------------------------------
    @admin.action(
        description=_("Requeue selected (back to the receiver that failed)"),
        permissions=["requeue"],
    )
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[ParkedMessage]) -> None:
        self._requeue(request, queryset, parking.MODE_RECEIVER)

    @admin.action(
        description=_("Republish selected to ALL receivers of the topic…"),
        permissions=["requeue"],
    )
    def republish_to_topic(
        self, request: HttpRequest, queryset: QuerySet[ParkedMessage]
    ) -> TemplateResponse | None:
        if request.POST.get("confirm") == "yes":
            self._requeue(request, queryset, parking.MODE_TOPIC)
            return None
        parked = queryset.filter(status=ParkedStatus.PARKED)
        routes = []
        for row in parked.values("routing_key").annotate(count=Count("id")).order_by("-count")[:50]:
            receivers = [
                r.name for r in default_registry.all() if row["routing_key"] in r.routing_keys
            ]
            routes.append({**row, "receivers": receivers})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Republish to ALL receivers of the topic?"),
            "count": parked.count(),
            "routes": routes,
            "action": "republish_to_topic",
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "filters": _filter_description(request),
        }
        return TemplateResponse(request, "django_rmq_retry/admin/republish_confirm.html", context)

    @admin.action(description=_("Discard selected"), permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[ParkedMessage]) -> None:
        count = parking.discard(queryset, user=request.user.get_username())
        self.message_user(
            request,
            ngettext(
                "Discarded %(count)d parked message.",
                "Discarded %(count)d parked messages.",
                count,
            )
            % {"count": count},
            messages.SUCCESS if count else messages.WARNING,
        )
        self._log(request, queryset, f"Discarded {count} parked message(s).")

    def _requeue(self, request: HttpRequest, queryset: QuerySet[ParkedMessage], mode: str) -> None:
        budget = self.requeue_time_budget
        deadline = (
            None
            if budget is None
            else time.monotonic() + max(0.0, budget - self.requeue_end_reserve)
        )
        broker_error: str | None = None
        try:
            result = parking.requeue(
                queryset, user=request.user.get_username(), mode=mode, deadline=deadline
            )
        except RmqRetryError as exc:
            # The broker went away: confirmed rows are marked, the rest were released.
            logger.exception("requeue from the admin stopped")
            result = getattr(exc, "result", None) or parking.RequeueResult()
            broker_error = str(exc)
        # What is left, counted as the list counts: an uncapped count after a large requeue
        # walks the rows it just updated (2.8 s at 1,000,000 rows).
        remaining = (
            _capped_count(queryset.filter(status=ParkedStatus.PARKED), COUNT_CAP)
            if result.stopped
            else 0
        )
        report = _RequeueReport(result, mode == parking.MODE_TOPIC, broker_error, remaining, budget)
        for level, text in report.messages():
            self.message_user(request, text, level)
        self._log(request, queryset, report.summary())

    def _log(self, request: HttpRequest, queryset: QuerySet[ParkedMessage], text: str) -> None:
        """One admin-history entry per operator action: who, how many, which selection."""
        across = request.POST.get("select_across") == "1"
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if across:
            selection = "all rows matching the filter"
        else:
            shown = ", ".join(selected[:20]) + (" …" if len(selected) > 20 else "")
            selection = f"{len(selected)} selected (ids {shown})"
        message = f"{text} Selection: {selection}. Filter: {_filter_description(request)}."
        single = selected[0] if len(selected) == 1 and not across else None
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(ParkedMessage).pk,
            object_id=single,
            object_repr=Truncator(text).chars(200),
            action_flag=CHANGE,
            change_message=message,
        )


@dataclass(frozen=True)
class _RequeueReport:
    """What an operator is told after a requeue action, and what the admin log keeps."""

    result: parking.RequeueResult
    topic: bool  # republished to every receiver of the topic
    broker_error: str | None
    remaining: int  # matching rows still parked when the time budget stopped the run
    budget: float | None

    @property
    def stopped(self) -> bool:
        return self.result.stopped and self.remaining > 0

    def messages(self) -> list[tuple[int, str]]:
        result, n = self.result, self.result.requeued
        out: list[tuple[int, str]] = []
        if n or not (result.failed or self.broker_error):
            if not n and not result.stopped:
                text = gettext("Nothing was requeued: none of the selected messages is parked.")
            elif self.topic:
                text = ngettext(
                    "Republished %(count)d message to ALL receivers of its topic.",
                    "Republished %(count)d messages to ALL receivers of their topics.",
                    n,
                ) % {"count": n}
            else:
                text = ngettext(
                    "Requeued %(count)d message to the receiver it failed in.",
                    "Requeued %(count)d messages to the receivers they failed in.",
                    n,
                ) % {"count": n}
            out.append((messages.SUCCESS if n else messages.WARNING, text))
        if result.failed:
            text = ngettext(
                "%(count)d message could not be published and stays parked: %(errors)s",
                "%(count)d messages could not be published and stay parked: %(errors)s",
                result.failed,
            ) % {"count": result.failed, "errors": "; ".join(result.errors[:3])}
            out.append((messages.ERROR, text))
        if self.broker_error:
            text = _(
                "Requeue stopped, the broker is unavailable: %(error)s. Messages not "
                "published stay parked; run the action again once the broker is back."
            ) % {"error": self.broker_error}
            out.append((messages.ERROR, text))
        if result.skipped:
            text = ngettext(
                "%(count)d message was skipped: another requeue is handling it.",
                "%(count)d messages were skipped: another requeue is handling them.",
                result.skipped,
            ) % {"count": result.skipped}
            out.append((messages.WARNING, text))
        if self.stopped:
            text = ngettext(
                "Stopped after %(seconds)d s to keep this page responsive; %(count)s "
                "matching message is still parked. Run the action again to continue "
                "(nothing is requeued twice), or use manage.py rmq_requeue.",
                "Stopped after %(seconds)d s to keep this page responsive; %(count)s "
                "matching messages are still parked. Run the action again to continue "
                "(nothing is requeued twice), or use manage.py rmq_requeue.",
                self.remaining,
            ) % {"seconds": int(self.budget or 0), "count": self.remaining}
            out.append((messages.WARNING, text))
        return out

    def summary(self) -> str:
        result = self.result
        verb = "Republished to ALL receivers of the topic" if self.topic else "Requeued"
        text = (
            f"{verb}: {result.requeued} requeued, {result.failed} failed, {result.skipped} skipped"
        )
        if self.stopped:
            text += f", stopped by the time budget with {self.remaining} left"
        if self.broker_error:
            text += f", stopped: {self.broker_error}"
        return text + "."


# --------------------------------------------------------------------------------------------
# Retry policies


def _describe_policy(policy: Any) -> str:
    if policy is None:
        return "—"
    delays = ", ".join(f"{d:g}s" for d in policy.schedule()[:6])
    if policy.max_attempts - 1 > 6:
        delays += ", …"
    return f"{policy.max_attempts} attempts; delays {delays or 'none'}; {policy.jitter} jitter"


class RetryPolicyForm(forms.ModelForm):
    """The receiver field lists the receivers registered in this process."""

    class Meta:
        model = RetryPolicy
        fields = (
            "receiver",
            "enabled",
            "max_attempts",
            "initial_delay",
            "multiplier",
            "max_delay",
            "jitter",
            "dont_retry",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        known = default_registry.all()
        if not known:
            return
        choices: list[tuple[str, str]] = [("", "---------")]
        for rec in known:
            code = _describe_policy(rec.policy) if rec.policy else _("settings default")
            choices.append(
                (rec.name, f"{rec.name} — topics {', '.join(rec.routing_keys)}; code: {code}")
            )
        current = self.instance.receiver if self.instance and self.instance.pk else ""
        if current and current not in {r.name for r in known}:
            choices.append((current, f"{current} (not registered in this process)"))
        self.fields["receiver"] = forms.ChoiceField(
            label=_("receiver"),
            choices=choices,
            help_text=_(
                "The receivers registered in this project (rmq_consume --list shows the same). "
                "This row overrides the policy declared in code; consumers pick it up within "
                "POLICY_CACHE_SECONDS."
            ),
        )


@admin.register(RetryPolicy)
class RetryPolicyAdmin(admin.ModelAdmin):
    form = RetryPolicyForm
    list_display = (
        "receiver",
        "enabled",
        "max_attempts",
        "delays",
        "jitter",
        "registered",
        "updated_at",
    )
    list_filter = ("enabled", "jitter")
    search_fields = ("receiver",)
    readonly_fields = ("updated_at",)
    fields = (
        "receiver",
        "enabled",
        "max_attempts",
        ("initial_delay", "multiplier", "max_delay"),
        "jitter",
        "dont_retry",
        "updated_at",
    )

    @admin.display(description=_("delays"))
    def delays(self, obj: RetryPolicy) -> str:
        try:
            schedule = obj.to_policy().schedule()
        except ValueError as exc:
            return f"invalid: {exc}"
        text = ", ".join(f"{d:g}s" for d in schedule[:6])
        return text + (", …" if len(schedule) > 6 else "") if text else "—"

    @admin.display(description=_("registered"), boolean=True)
    def registered(self, obj: RetryPolicy) -> bool:
        return default_registry.get(obj.receiver) is not None


from . import admin_outbox  # noqa: E402, F401  (the outbox's admin registers itself)
