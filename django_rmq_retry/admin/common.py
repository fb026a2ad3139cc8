"""Small helpers every page of the parked-messages admin shares."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db import connections, transaction
from django.http import HttpRequest
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

logger = logging.getLogger("django_rmq_retry.admin")

_View = TypeVar("_View", bound=Callable[..., Any])


def _outside_request_transactions(view: _View) -> _View:
    """``transaction.non_atomic_requests`` for every configured database."""
    for alias in connections:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


class ViewOnly:
    """An admin (or inline) that shows rows and never adds, changes or deletes one: what it
    shows is written by the consumers and operations, and changed only through its actions."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SeenByParkedViewers(ViewOnly):
    """A view-only page that whoever may view parked messages may see too (the requeues
    that move them, the breakers that stopped their receivers), besides the model's own
    view permission."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(
            "django_rmq_retry.view_parkedmessage"
        ) or super().has_view_permission(request, obj)  # type: ignore[misc]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)


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


#: Our own exceptions (``Reject``, ``Retry``...) are shown by their class name: the dotted
#: path of a library class says nothing to an operator that the name does not.
_OWN_PREFIX = "django_rmq_retry."


def _error_type_label(dotted: str) -> SafeString:
    """An exception's dotted path, wrappable; ours by their short name (full path in the tooltip)."""
    if dotted.startswith(_OWN_PREFIX):
        return format_html('<span title="{}">{}</span>', dotted, dotted.rsplit(".", 1)[-1])
    return _breakable(dotted)


#: Times on the operator's pages carry seconds and the time zone: "14:02" cannot tell
#: which of two failures a minute apart came first.
WHEN_FORMAT = "Y-m-d H:i:s T"


def _when(value: datetime | None) -> str:
    """``value`` in the current time zone with seconds, or a dash."""
    if value is None:
        return "—"
    if timezone.is_naive(value):  # USE_TZ = False, or an old history event
        return dateformat.format(value, "Y-m-d H:i:s")
    return dateformat.format(timezone.localtime(value), WHEN_FORMAT)
