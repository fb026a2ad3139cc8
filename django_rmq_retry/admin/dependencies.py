"""The "Dependencies" page: every dependency's breaker (state, since, failures in the
window, next probe, trip history) and an operator's "Open now" / "Close now".

The page reads the rows through ``breakers.overview`` (the same as ``rmq_dependencies``);
the buttons are transitions like any other (``breakers.state.force``), gated by the
``operate_dependency`` permission. Nothing here decides anything or talks to the broker:
the consumers see the new state within a second and stop or resume their queues.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..breakers import overview, state
from ..core.breaker import State
from ..models import Dependency
from .common import SeenByParkedViewers, _when

#: The buttons: the state each sets, and what the operator is told once it took effect.
VERBS = {
    "open": (State.OPEN, _("Open now"), _("opened")),
    "close": (State.CLOSED, _("Close now"), _("closed")),
}


@admin.register(Dependency)
class DependencyAdmin(SeenByParkedViewers, admin.ModelAdmin):
    """One page for every dependency; rows are never added, changed or deleted here."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("django_rmq_retry.operate_dependency"))

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "<str:name>/<str:verb>/",
                self.admin_site.admin_view(self.operate_view),
                name="{}_{}_operate".format(*info),
            ),
            *super().get_urls(),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        info = self.opts.app_label, self.opts.model_name
        can_operate = self.has_operate_permission(request)
        rows = []
        for view in overview.views():
            verb = "close" if view.state is not State.CLOSED else "open"
            rows.append(
                {
                    "view": view,
                    "label": view.breaker.state.value.replace("_", "-"),
                    "since": _when(view.breaker.since),
                    "next_probe": _when(view.next_probe),
                    "history": [(_when(e.at), e) for e in state.history(view.name, limit=10)],
                    "verb": verb,
                    "verb_label": VERBS[verb][1],
                    "verb_url": reverse(
                        "{}:{}_{}_operate".format(self.admin_site.name, *info),
                        args=[view.name, verb],
                    ),
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Dependencies"),
            "rows": rows,
            "can_operate": can_operate,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "django_rmq_retry/admin/dependencies.html", context)

    @method_decorator(require_POST)
    def operate_view(self, request: HttpRequest, name: str, verb: str) -> HttpResponseRedirect:
        """Open or close ``name``'s breaker now (a POST, with the operate permission)."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        if verb not in VERBS:
            raise PermissionDenied
        to, _label, done = VERBS[verb]
        back = HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:django_rmq_retry_dependency_changelist")
        )
        try:
            changed = state.force(name, to, f"{request.user.get_username()} (admin)")
        except KeyError:
            self.message_user(request, _("No such dependency."), messages.ERROR)
            return back
        if changed:
            self.message_user(request, _("%(name)s: %(done)s.") % {"name": name, "done": done})
        else:
            self.message_user(
                request,
                _("%(name)s was %(done)s already.") % {"name": name, "done": done},
                messages.WARNING,
            )
        return back
