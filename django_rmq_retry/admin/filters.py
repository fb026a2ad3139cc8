"""Range filters of the parked-messages list: parked between, last failed between,
attempts >= N. Each is a small GET form in the sidebar; each range is one index range
(``parked_at``, ``last_failure_at``, ``attempts``; see the model's indexes)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.translation import gettext_lazy as _


def _as_datetime(text: str) -> datetime:
    value = parse_datetime(text)
    if value is None:
        day = parse_date(text)
        if day is None:
            raise IncorrectLookupParameters(f"not a date or time: {text!r}")
        value = datetime(day.year, day.month, day.day)
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value


class RangeFilter(admin.ListFilter):
    """A ``from``/``to`` (or ``at least``) form for one column; see the module docstring."""

    template = "django_rmq_retry/admin/range_filter.html"
    field = ""
    #: (GET parameter, lookup, input type, label)
    inputs: tuple[tuple[str, str, str, Any], ...] = ()

    def __init__(
        self, request: HttpRequest, params: dict[str, Any], model: Any, model_admin: Any
    ) -> None:
        super().__init__(request, params, model, model_admin)
        self.values: dict[str, str] = {}
        for name, *_rest in self.inputs:
            if name in params:
                value = params.pop(name)
                value = value[-1] if isinstance(value, list) else value
                if str(value).strip():
                    self.values[name] = str(value).strip()

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [name for name, *_rest in self.inputs]

    def convert(self, kind: str, text: str) -> Any:
        if kind == "number":
            try:
                return int(text)
            except ValueError:
                raise IncorrectLookupParameters(f"not a number: {text!r}") from None
        return _as_datetime(text)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        lookups = {}
        for name, lookup, kind, _label in self.inputs:
            if name in self.values:
                lookups[f"{self.field}__{lookup}"] = self.convert(kind, self.values[name])
        return queryset.filter(**lookups) if lookups else queryset

    def choices(self, changelist: Any) -> Any:
        ours = {name for name, *_rest in self.inputs}
        hidden = [
            (key, value)
            for key, values in changelist.params.items()
            if key not in ours and key != "p"
            for value in (values if isinstance(values, list) else [values])
        ]
        yield {
            "hidden": hidden,
            "fields": [
                {"name": name, "type": kind, "label": label, "value": self.values.get(name, "")}
                for name, _lookup, kind, label in self.inputs
            ],
            "active": bool(self.values),
            "clear": changelist.get_query_string(remove=[*sorted(ours), "p"]),
        }


class ParkedBetweenFilter(RangeFilter):
    title = _("parked between")
    field = "parked_at"
    inputs = (
        ("parked_from", "gte", "datetime-local", _("from")),
        ("parked_to", "lt", "datetime-local", _("to")),
    )


class FailedBetweenFilter(RangeFilter):
    title = _("last failed between")
    field = "last_failure_at"
    inputs = (
        ("failed_from", "gte", "datetime-local", _("from")),
        ("failed_to", "lt", "datetime-local", _("to")),
    )


class AttemptsFilter(RangeFilter):
    title = _("attempts")
    field = "attempts"
    inputs = (("attempts_min", "gte", "number", _("at least")),)
