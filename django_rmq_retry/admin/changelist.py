"""The parked-messages list: pages that do not grow with the table, indexed filters, search."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from ..models import ParkedMessage
from ..parking import WordsMatch, distinct_values
from ..parking.newest import newest_first_ids
from .common import _breakable, _error_type_label, _outside_request_transactions, _when

# --------------------------------------------------------------------------------------------
# Parked messages: pages that do not grow with the table

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


class ChangelistMixin(admin.ModelAdmin):
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
        return _error_type_label(obj.error_type)

    @admin.display(description=_("parked at"), ordering="parked_at")
    def parked_at_display(self, obj: ParkedMessage) -> str:
        return _when(obj.parked_at)

    @admin.display(description=_("error"))
    def error_short(self, obj: ParkedMessage) -> str:
        return Truncator(obj.error_message).chars(80)
