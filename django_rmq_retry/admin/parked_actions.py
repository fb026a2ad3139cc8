"""Operator actions on parked messages: requeue, republish to the topic, discard."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.utils.text import Truncator
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from .. import parking
from ..core.errors import RmqRetryError
from ..models import ParkedMessage, ParkedStatus
from ..parking import operations
from ..registry import default_registry
from .changelist import COUNT_CAP, _capped_count
from .common import _filter_description, _outside_request_transactions, logger
from .requeue_operations import OperationForm


class OperationsMixin(admin.ModelAdmin):
    """The actions; each calls a :mod:`django_rmq_retry.parking` service."""

    #: Seconds a requeue action may take, the page's answer included: the run stops at a
    #: batch boundary and reports what is left (running it again continues; nothing is
    #: requeued twice). None: no limit. Keep it under your server's request timeout
    #: (gunicorn's default is 30 s).
    requeue_time_budget: float | None = 20.0
    #: Seconds of that budget kept for what follows the run's deadline: the batches in
    #: flight confirmed and marked, the claims released, the capped count of what is left.
    #: Over a large table these take seconds: without the reserve a click would overrun its
    #: budget by as much (see bench/README.md).
    requeue_end_reserve: float = 5.0

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

    @admin.action(
        description=_("Requeue selected in the background (canary, ramp, rate)…"),
        permissions=["requeue"],
    )
    def requeue_in_background(
        self, request: HttpRequest, queryset: QuerySet[ParkedMessage]
    ) -> TemplateResponse | HttpResponseRedirect:
        """Ask for the options, then start an operation the consumers run (not this request)."""
        form = OperationForm(request.POST if request.POST.get("confirm") == "yes" else None)
        if form.is_bound and form.is_valid():
            options = form.cleaned_data
            op = operations.create(
                queryset,
                user=request.user.get_username(),
                description=_filter_description(request),
                canary=options["canary"] or 0,
                ramp=options["ramp"],
                rate=options["rate"],
                stop_on_failure=options["stop_on_failure"],
            )
            self._log(request, queryset, f"Started requeue operation #{op.pk} ({op.total} rows).")
            self.message_user(
                request,
                ngettext(
                    "Requeue operation #%(id)d started for %(count)d message.",
                    "Requeue operation #%(id)d started for %(count)d messages.",
                    op.total,
                )
                % {"id": op.pk, "count": op.total},
                messages.SUCCESS,
            )
            return HttpResponseRedirect(
                reverse(
                    f"{self.admin_site.name}:django_rmq_retry_requeueoperation_change",
                    args=[op.pk],
                )
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Requeue in the background"),
            "form": form if form.is_bound else OperationForm(),
            "count": _capped_count(queryset.filter(status=ParkedStatus.PARKED), COUNT_CAP),
            "action": "requeue_in_background",
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "filters": _filter_description(request),
        }
        return TemplateResponse(request, "django_rmq_retry/admin/operation_start.html", context)

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

    # One message, from its detail page ------------------------------------------------------
    @method_decorator(require_POST)
    @_outside_request_transactions
    def requeue_one_view(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        """The detail page's Requeue button: the same service and claims as the action."""
        if not self.has_requeue_permission(request):
            raise PermissionDenied
        row = get_object_or_404(ParkedMessage, pk=object_id)
        self._requeue(request, ParkedMessage.objects.filter(pk=row.pk), parking.MODE_RECEIVER)
        return self._back_to(row)

    @method_decorator(require_POST)
    @_outside_request_transactions
    def discard_one_view(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        """The detail page's Discard button (the row is kept, marked discarded)."""
        if not self.has_discard_permission(request):
            raise PermissionDenied
        row = get_object_or_404(ParkedMessage, pk=object_id)
        self.discard_selected(request, ParkedMessage.objects.filter(pk=row.pk))
        return self._back_to(row)

    def _back_to(self, row: ParkedMessage) -> HttpResponseRedirect:
        info = self.opts.app_label, self.opts.model_name
        return HttpResponseRedirect(
            reverse("{}:{}_{}_change".format(self.admin_site.name, *info), args=[row.pk])
        )

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rmq_retry.requeue_parkedmessage")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rmq_retry.discard_parkedmessage")

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
            result = parking.RequeueResult()
            if isinstance(exc, parking.RequeueInterrupted):
                result = exc.partial
            broker_error = str(exc)
        # What is left, counted as the list counts: an uncapped count after a large requeue
        # walks the rows it just updated (seconds over a large table; see bench/README.md).
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
