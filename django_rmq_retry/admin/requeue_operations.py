"""Background requeue operations in the admin: the list, one operation's live progress, and
its pause, resume and cancel buttons.

The admin never runs an operation: it creates one (the parked messages' background action)
and watches the row the consumers' housekeeping thread (or ``rmq_operations``) advances. The
page polls a small JSON view, so a reload, or a second operator, sees the same progress.
Everything on the page that the operation's state changes (heading, breadcrumb, state,
reason, counters, who changed it, the buttons offered) follows that poll: the page never
says "Running" beside a "Done" box, nor offers Pause on a paused or finished operation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..models import OperationState, RequeueOperation
from ..parking import operations
from .common import SeenByParkedViewers, _when

#: Each verb's button, and what the operator is told once it took effect. The page shows
#: the ones ``operations.progress(op).actions`` allows (a forged post of another is refused
#: by the operation's state anyway).
VERBS = {
    "pause": (_("Pause"), _("paused")),
    "resume": (_("Resume"), _("resumed")),
    "cancel": (_("Cancel"), _("cancelled")),
}


#: Seconds a running operation may be overdue, with no step in flight, before the page
#: says that no process is stepping operations (a step is due every second or sooner).
IDLE_SECONDS = 5


def live_progress(op: RequeueOperation) -> dict[str, Any]:
    """The operation as the page shows it and its poll refreshes: the counters, what an
    operator may do now (``actions``), who changed its state, and ``idle``: it is running
    but nothing steps it (no consumer, no ``rmq_operations``), so it would wait for ever."""
    progress = operations.progress(op)
    overdue = op.next_at < timezone.now() - timedelta(seconds=IDLE_SECONDS)
    return {
        **progress.as_dict(),
        "state_changed_by": op.state_changed_by or "",
        "idle": op.state == OperationState.RUNNING and not progress.stepping and overdue,
    }


def _live(key: str, value: Any) -> SafeString:
    """A read-only field's value in a span the page's poll rewrites."""
    return format_html('<span data-live="{}">{}</span>', key, value)


class OperationForm(forms.Form):
    """The options of a background requeue (the same as ``rmq_requeue``'s)."""

    canary = forms.IntegerField(
        label=_("Canary"),
        min_value=0,
        required=False,
        help_text=_("Send this many first and wait until each is handled or fails again."),
    )
    ramp = forms.BooleanField(
        label=_("Ramp up"),
        required=False,
        help_text=_("Batches of 1, 5, 20, 100, 500, each waiting for its outcome, then full."),
    )
    rate = forms.FloatField(
        label=_("Rate (messages per second)"),
        min_value=0.1,
        required=False,
        help_text=_("Empty: as fast as the broker confirms."),
    )
    stop_on_failure = forms.BooleanField(
        label=_("Stop at the first new failure"), required=False, initial=True
    )


@admin.register(RequeueOperation)
class RequeueOperationAdmin(SeenByParkedViewers, admin.ModelAdmin):
    """View-only rows; pause, resume and cancel need the requeue permission."""

    list_display = (
        "id",
        "state",
        "created_by",
        "created_when",
        "total",
        "sent",
        "handled",
        "failed_again",
        "left",
    )
    list_filter = ("state",)
    ordering = ("-created_at", "-id")
    change_form_template = "django_rmq_retry/admin/requeueoperation_change_form.html"
    fields = (
        # What a step or an operator changes is "live_": rewritten by the page's poll.
        ("live_state", "live_reason"),
        ("created_by", "created_when"),
        "description",
        ("canary", "ramp", "rate", "stop_on_failure"),
        ("live_refused", "live_skipped"),  # the other counters are the live table above
        "live_changed_by",
    )
    readonly_fields = (
        "live_state",
        "live_reason",
        "live_refused",
        "live_skipped",
        "live_changed_by",
        "state",
        "state_reason",
        "created_by",
        "created_when",
        "description",
        "canary",
        "ramp",
        "rate",
        "stop_on_failure",
        "total",
        "sent",
        "handled",
        "failed_again",
        "refused",
        "skipped",
        "state_changed_by",
    )

    def has_control_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rmq_retry.requeue_parkedmessage")

    @admin.display(description=_("created"), ordering="created_at")
    def created_when(self, obj: RequeueOperation) -> str:
        return _when(obj.created_at)

    @admin.display(description=_("left"))
    def left(self, obj: RequeueOperation) -> int:
        return operations.progress(obj).left

    @admin.display(description=_("state"))
    def live_state(self, obj: RequeueOperation) -> SafeString:
        return _live("state_label", obj.get_state_display())

    @admin.display(description=_("why"))
    def live_reason(self, obj: RequeueOperation) -> SafeString:
        return _live("reason", obj.state_reason)

    @admin.display(description=_("refused"))
    def live_refused(self, obj: RequeueOperation) -> SafeString:
        return _live("refused", obj.refused)

    @admin.display(description=_("skipped"))
    def live_skipped(self, obj: RequeueOperation) -> SafeString:
        return _live("skipped", obj.skipped)

    @admin.display(description=_("state changed by"))
    def live_changed_by(self, obj: RequeueOperation) -> SafeString:
        return _live("state_changed_by", obj.state_changed_by)

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        extra = [
            path(
                "<int:object_id>/progress.json",
                self.admin_site.admin_view(self.progress_view),
                name="{}_{}_progress".format(*info),
            ),
        ]
        for verb in ("pause", "resume", "cancel"):
            extra.append(
                path(
                    f"<int:object_id>/{verb}/",
                    self.admin_site.admin_view(self.control_view),
                    {"verb": verb},
                    name="{}_{}_{}".format(*info, verb),
                )
            )
        return extra + super().get_urls()

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        op = self.get_object(request, object_id)
        info = self.admin_site.name, self.opts.app_label, self.opts.model_name
        extra_context = {**(extra_context or {}), "can_control": False, "progress": None}
        if op is not None:
            extra_context.update(
                {
                    "can_control": self.has_control_permission(request),
                    "progress": live_progress(op),
                    "progress_url": reverse("{}:{}_{}_progress".format(*info), args=[object_id]),
                    "op_title": _("Requeue operation #%(id)d") % {"id": op.pk},
                    "verbs": [
                        {
                            "name": verb,
                            "label": label,
                            "url": reverse("{}:{}_{}_{}".format(*info, verb), args=[op.pk]),
                        }
                        for verb, (label, _done) in VERBS.items()
                    ],
                }
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def progress_view(self, request: HttpRequest, object_id: int) -> JsonResponse:
        """The operation as the page shows it, for the page's poll (one primary-key read)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        op = get_object_or_404(RequeueOperation, pk=object_id)
        return JsonResponse(live_progress(op))

    @method_decorator(require_POST)
    def control_view(self, request: HttpRequest, object_id: int, verb: str) -> HttpResponseRedirect:
        """Pause, resume or cancel; the operator is told what really happened."""
        if not self.has_control_permission(request):
            raise PermissionDenied
        get_object_or_404(RequeueOperation, pk=object_id)
        user = request.user.get_username()
        control = {
            "pause": operations.pause,
            "resume": operations.resume,
            "cancel": operations.cancel,
        }[verb](object_id, user)
        said = {"id": object_id, "done": VERBS[verb][1]}
        if control.ok and control.stepping and verb != "resume":
            self.message_user(
                request,
                _(
                    "Operation #%(id)d %(done)s. The step in progress stops after its current "
                    "batch; its copies are counted as sent."
                )
                % said,
            )
        elif control.ok:
            self.message_user(request, _("Operation #%(id)d %(done)s.") % said)
        else:
            by = _(" (by %(who)s)") % {"who": control.changed_by} if control.changed_by else ""
            state = OperationState(control.state).label.lower() if control.state else "?"
            self.message_user(
                request,
                _("Operation #%(id)d was not %(done)s: it is %(state)s%(by)s.")
                % {**said, "state": state, "by": by},
                messages.WARNING,
            )
        info = self.admin_site.name, self.opts.app_label, self.opts.model_name
        return HttpResponseRedirect(reverse("{}:{}_{}_change".format(*info), args=[object_id]))
