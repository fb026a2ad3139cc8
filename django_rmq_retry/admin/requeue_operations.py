"""Background requeue operations in the admin: the list, one operation's live progress, and
its pause, resume and cancel buttons.

The admin never runs an operation: it creates one (the parked messages' background action)
and watches the row the consumers' housekeeping thread (or ``rmq_operations``) advances. The
page polls a small JSON view, so a reload, or a second operator, sees the same progress.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..models import RequeueOperation
from ..parking import operations
from .common import _when


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
class RequeueOperationAdmin(admin.ModelAdmin):
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
        ("state", "state_reason"),
        ("created_by", "created_when"),
        "description",
        ("canary", "ramp", "rate", "stop_on_failure"),
        ("refused", "skipped"),  # the other counters are the live table above
        "state_changed_by",
    )
    readonly_fields = (
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

    # Operators who may see parked messages may watch their requeues.
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(
            "django_rmq_retry.view_parkedmessage"
        ) or super().has_view_permission(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_control_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rmq_retry.requeue_parkedmessage")

    @admin.display(description=_("created"), ordering="created_at")
    def created_when(self, obj: RequeueOperation) -> str:
        return _when(obj.created_at)

    @admin.display(description=_("left"))
    def left(self, obj: RequeueOperation) -> int:
        return operations.progress(obj).left

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
        extra_context = {
            **(extra_context or {}),
            "can_control": self.has_control_permission(request),
            "progress": operations.progress(op).as_dict() if op else None,
            "progress_url": reverse("{}:{}_{}_progress".format(*info), args=[object_id])
            if op
            else "",
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def progress_view(self, request: HttpRequest, object_id: int) -> JsonResponse:
        """The operation's counters, for the page's poll (one primary-key read)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        op = get_object_or_404(RequeueOperation, pk=object_id)
        return JsonResponse(operations.progress(op).as_dict())

    @method_decorator(require_POST)
    def control_view(self, request: HttpRequest, object_id: int, verb: str) -> HttpResponseRedirect:
        """Pause, resume or cancel; the consumers see it at their next step."""
        if not self.has_control_permission(request):
            raise PermissionDenied
        get_object_or_404(RequeueOperation, pk=object_id)
        user = request.user.get_username()
        done = {
            "pause": operations.pause,
            "resume": operations.resume,
            "cancel": operations.cancel,
        }[verb](object_id, user)
        if done:
            self.message_user(
                request, _("Operation #%(id)d: %(verb)s.") % {"id": object_id, "verb": verb}
            )
        else:
            self.message_user(
                request,
                _("Operation #%(id)d cannot %(verb)s in its state.")
                % {"id": object_id, "verb": verb},
                messages.WARNING,
            )
        info = self.admin_site.name, self.opts.app_label, self.opts.model_name
        return HttpResponseRedirect(reverse("{}:{}_{}_change".format(*info), args=[object_id]))
