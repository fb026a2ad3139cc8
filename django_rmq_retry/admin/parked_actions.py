"""Operator actions on parked messages: requeue, republish to the topic, discard."""

from __future__ import annotations

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
from ..models import ParkedMessage, ParkedStatus, RequeueOperation
from ..parking import operations
from ..registry import default_registry
from .changelist import COUNT_CAP, _capped_count
from .common import _filter_description, _outside_request_transactions
from .requeue_operations import OperationForm


class OperationsMixin(admin.ModelAdmin):
    """The actions; each calls a :mod:`django_rmq_retry.parking` service.

    Every requeue (to the receiver, to the topic, the detail page's button) starts a
    background operation and shows its page: the web request writes the selection and
    publishes nothing. The consumers' housekeeping thread (or ``manage.py
    rmq_operations``) sends the messages, with the claims and confirms of any requeue,
    while the page follows its progress and says when nothing steps it. No step runs in
    the request, not even for one row: a step waits on the broker (connects, confirms,
    nack pauses) for as long as the broker takes, which a page cannot promise to bound,
    and a running consumer starts a due operation within a second anyway.
    """

    # Actions --------------------------------------------------------------------------------
    @admin.action(
        description=_("Requeue selected (back to the receiver that failed)"),
        permissions=["requeue"],
    )
    def requeue_selected(
        self, request: HttpRequest, queryset: QuerySet[ParkedMessage]
    ) -> HttpResponseRedirect:
        return self._start(request, queryset, parking.MODE_RECEIVER)

    @admin.action(
        description=_("Republish selected to ALL receivers of the topic…"),
        permissions=["requeue"],
    )
    def republish_to_topic(
        self, request: HttpRequest, queryset: QuerySet[ParkedMessage]
    ) -> TemplateResponse | HttpResponseRedirect:
        if request.POST.get("confirm") == "yes":
            return self._start(request, queryset, parking.MODE_TOPIC)
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
        description=_("Requeue selected with a canary, ramp or rate…"),
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
            return self._to_operation(op)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Requeue with a canary, ramp or rate"),
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
        """The detail page's Requeue button: an operation of one row, like the action."""
        if not self.has_requeue_permission(request):
            raise PermissionDenied
        row = get_object_or_404(ParkedMessage, pk=object_id)
        one = ParkedMessage.objects.filter(pk=row.pk)
        return self._start(request, one, parking.MODE_RECEIVER, row)

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

    def _start(
        self,
        request: HttpRequest,
        queryset: QuerySet[ParkedMessage],
        mode: str,
        row: ParkedMessage | None = None,
    ) -> HttpResponseRedirect:
        """Start a background operation over the selection (every message once, no canary,
        no pause between batches) and show its page."""
        topic = mode == parking.MODE_TOPIC
        op = operations.create(
            queryset,
            user=request.user.get_username(),
            description=_filter_description(request),
            mode=mode,
            stop_on_failure=False,  # "requeue these" means all of them, as before
        )
        verb = "republish to ALL receivers of the topic" if topic else "requeue"
        self._log(request, queryset, f"Started {verb} operation #{op.pk} ({op.total} rows).", row)
        self._tell_started(request, op, topic)
        return self._to_operation(op)

    def _tell_started(self, request: HttpRequest, op: RequeueOperation, topic: bool) -> None:
        if op.total == 0:
            self.message_user(
                request,
                gettext(
                    "Operation #%(id)d: nothing to requeue, none of the selected messages "
                    "is parked."
                )
                % {"id": op.pk},
                messages.WARNING,
            )
            return
        if topic:
            text = ngettext(
                "Operation #%(id)d started: %(count)d message will be republished to ALL "
                "receivers of its topic by the consumers, in the background.",
                "Operation #%(id)d started: %(count)d messages will be republished to ALL "
                "receivers of their topics by the consumers, in the background.",
                op.total,
            )
        else:
            text = ngettext(
                "Operation #%(id)d started: %(count)d message will be requeued to the "
                "receiver it failed in by the consumers, in the background.",
                "Operation #%(id)d started: %(count)d messages will be requeued to the "
                "receivers they failed in by the consumers, in the background.",
                op.total,
            )
        self.message_user(request, text % {"id": op.pk, "count": op.total}, messages.SUCCESS)

    def _to_operation(self, op: RequeueOperation) -> HttpResponseRedirect:
        return HttpResponseRedirect(
            reverse(
                f"{self.admin_site.name}:django_rmq_retry_requeueoperation_change", args=[op.pk]
            )
        )

    def _log(
        self,
        request: HttpRequest,
        queryset: QuerySet[ParkedMessage],
        text: str,
        row: ParkedMessage | None = None,
    ) -> None:
        """One admin-history entry per operator action: who, how many, which selection
        (``row``: the one of a detail page's button)."""
        across = request.POST.get("select_across") == "1"
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if row is not None:
            selected = [str(row.pk)]
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
