"""Edit a parked message and requeue the edited copy (exactly one copy goes out).

Three steps on one page: the form (body, headers), the diff of what changed (the same
form, posted with ``preview``), then the requeue (posted with ``confirm``; the edit is
validated again, so what was previewed is what is sent): a one-row background operation
that carries the edit, whose page the operator is shown next. Behind its own permission,
``edit_parkedmessage``.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from ..models import ParkedMessage
from ..parking import edit
from .common import _outside_request_transactions
from .detail import field_errors_table


class EditMixin(admin.ModelAdmin):
    def has_edit_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rmq_retry.edit_parkedmessage")

    @_outside_request_transactions
    def edit_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_edit_permission(request):
            raise PermissionDenied
        row = get_object_or_404(ParkedMessage, pk=object_id)
        info = self.admin_site.name, self.opts.app_label, self.opts.model_name
        change_url = reverse("{}:{}_{}_change".format(*info), args=[row.pk])
        form = edit.editable(row)
        body = request.POST.get("body", form.body)
        headers = request.POST.get(
            "headers", json.dumps(form.headers, indent=2, sort_keys=True, default=str)
        )
        accept = request.POST.get("accept_bytes") == "on"
        error = ""
        field_errors: Any = None
        prepared: edit.Edit | None = None
        refused = edit.edit_waiting(row)
        if refused:
            error = refused
        elif request.method == "POST":
            try:
                prepared = edit.prepare(row, body, headers, accept_bytes=accept)
            except edit.EditError as exc:
                error = str(exc)
                if exc.field_errors:  # a typed message's: each failing field, by the JSON
                    field_errors = field_errors_table(exc.field_errors)
            if prepared is not None and not prepared.changed:
                error = str(_("Nothing changed: use Requeue to send the message as it is."))
            if prepared is not None and not error and "confirm" in request.POST:
                return self._send_edit(request, row, prepared, change_url)
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Edit and requeue parked message #%(id)s") % {"id": row.pk},
            "row": row,
            "kind": form.kind,
            "body": body,
            "headers": headers,
            "accept_bytes": accept,
            "error": error,
            "field_errors": field_errors if error else None,
            "edit": None if error else prepared,
            "change_url": change_url,
        }
        return TemplateResponse(request, "django_rmq_retry/admin/parkedmessage_edit.html", context)

    def _send_edit(
        self, request: HttpRequest, row: ParkedMessage, prepared: edit.Edit, change_url: str
    ) -> HttpResponse:
        """Start the operation that sends the edited copy and show its page, like every
        requeue of the admin: the request publishes nothing."""
        user = request.user.get_username()
        try:
            op = edit.requeue_edited(row, prepared, user=user)
        except edit.EditError as exc:  # not parked any more, or an edit of it waits
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(change_url)
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(ParkedMessage).pk,
            object_id=str(row.pk),
            object_repr=f"parked message #{row.pk}"[:200],
            action_flag=CHANGE,
            change_message=(
                f"Edited; operation #{op.pk} requeues one copy, the edit. Diff:\n{prepared.diff}"
            )[:10000],
        )
        self.message_user(
            request,
            _(
                "Operation #%(id)d started: the edited copy will be requeued by the consumers, "
                "in the background; the original is kept."
            )
            % {"id": op.pk},
            messages.SUCCESS,
        )
        return HttpResponseRedirect(
            reverse(
                f"{self.admin_site.name}:django_rmq_retry_requeueoperation_change", args=[op.pk]
            )
        )
