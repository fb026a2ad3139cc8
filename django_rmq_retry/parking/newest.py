"""The first rows of a newest-first list whose filter the newest rows fail (#16).

For ``WHERE <words> ORDER BY parked_at DESC LIMIT 50`` PostgreSQL walks the ``parked_at``
index from the newest row and reads each row until 50 match; when the newest rows are an
incident of other errors that is a heap page per row for a hundred thousand rows. The
full-text index says which rows match, not which are newest. So :func:`newest_first_ids`
reads the list slice by slice, newest first: a slice is the next rows by ``parked_at``
(1,000, then more, its bounds read from that index alone), and its matches come from a
``BitmapAnd`` of the filter's indexes and the slice's ``parked_at`` range, so only matching
rows touch the heap. A slice holds at most :data:`MAX_SLICE` rows: more, and the range's
bitmap outgrows PostgreSQL's default ``work_mem`` (4 MB, about 65,000 heap pages), turns
lossy and every row on its pages is read again. Slices are disjoint and in the list's order,
so their first rows, concatenated, are the list's first rows: the same rows in the same order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Field, QuerySet

#: The column the list is ordered by, newest first.
COLUMN = "parked_at"
#: Rows of the first slice (a word most rows hold is found there), then each slice
#: :data:`GROWTH` times the last, up to :data:`MAX_SLICE`.
FIRST_SLICE = 1_000
GROWTH = 8
MAX_SLICE = 50_000
#: Slices before the rest is left to PostgreSQL's own plan (a word only old rows hold).
MAX_SLICES = 16
#: A filter known to match at most this many rows is read whole, in one statement.
WHOLE = 10_000


def newest_first_ids(
    queryset: QuerySet[Any], stop: int, total: int | None = None
) -> list[Any] | None:
    """The primary keys of ``queryset[:stop]``, in its order; ``None`` where this does not
    apply (not PostgreSQL, or not ordered by ``parked_at`` descending first).

    ``total``: how many rows the filter matches, if known exactly (a capped count).
    """
    order = _order_fields(queryset)
    if order is None or connections[queryset.db].vendor != "postgresql":
        return None
    if stop <= 0:
        return []
    if total is not None and total <= WHOLE:
        return _first_ids(queryset, order, stop)
    ids: list[Any] = []
    newer: datetime | None = None  # the slice's upper bound (exclusive)
    size = FIRST_SLICE
    for _ in range(MAX_SLICES):
        older = _lower_bound(queryset, newer, size)
        window = queryset if newer is None else queryset.filter(**{f"{COLUMN}__lt": newer})
        if older is not None:
            window = window.filter(**{f"{COLUMN}__gte": older})
        ids += _first_ids(window, order, stop - len(ids))
        if len(ids) >= stop or older is None:
            return ids
        newer, size = older, min(size * GROWTH, MAX_SLICE)
    rest = queryset if newer is None else queryset.filter(**{f"{COLUMN}__lt": newer})
    return ids + list(rest.values_list("pk", flat=True)[: stop - len(ids)])


def _order_fields(queryset: QuerySet[Any]) -> list[tuple[Field[Any, Any], bool]] | None:
    """The list's order as (field, descending) pairs, if it is plain fields with
    ``-parked_at`` first (what the slices assume); else ``None``."""
    query = queryset.query
    if query.is_sliced or query.distinct or query.combinator:
        return None
    ordering = query.order_by or (queryset.model._meta.ordering if query.default_ordering else ())
    if not ordering or ordering[0] != f"-{COLUMN}":
        return None
    opts = queryset.model._meta
    fields: list[tuple[Field[Any, Any], bool]] = []
    for item in ordering:
        if not isinstance(item, str) or "__" in item or item.lstrip("-") in ("", "?"):
            return None
        name = item.lstrip("-")
        field = opts.pk if name == "pk" else opts.get_field(name)
        if not isinstance(field, Field) or not field.concrete:
            return None
        fields.append((field, item.startswith("-")))
    return fields


def _lower_bound(queryset: QuerySet[Any], newer: datetime | None, size: int) -> datetime | None:
    """``parked_at`` of the ``size``-th newest row older than ``newer`` (of the whole table:
    an index-only read of the ``parked_at`` index); ``None`` if fewer rows are left."""
    rows = queryset.model._base_manager.using(queryset.db).order_by(f"-{COLUMN}")
    if newer is not None:
        rows = rows.filter(**{f"{COLUMN}__lt": newer})
    found = list(rows.values_list(COLUMN, flat=True)[size - 1 : size])
    return found[0] if found else None


def _first_ids(
    queryset: QuerySet[Any], order: list[tuple[Field[Any, Any], bool]], limit: int
) -> list[Any]:
    """The first ``limit`` primary keys of ``queryset`` in ``order``: its matching rows found
    as a whole first (a ``MATERIALIZED`` CTE, planned without the ``LIMIT``, so by the
    filter's indexes rather than a walk in the list's order), then sorted."""
    connection = connections[queryset.db]
    pk = queryset.model._meta.pk
    assert pk is not None
    fields = list(dict.fromkeys([pk, *(field for field, _ in order)]))
    inner = queryset.order_by().values_list(*(field.name for field in fields))
    sql, params = inner.query.get_compiler(using=queryset.db).as_sql()
    # By position: the CTE's column names are the compiler's to choose.
    order_sql = ", ".join(
        f"{fields.index(field) + 1} {'DESC' if desc else 'ASC'}" for field, desc in order
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH m AS MATERIALIZED ({sql}) SELECT * FROM m ORDER BY {order_sql} LIMIT %s",
            [*params, limit],
        )
        return [row[0] for row in cursor.fetchall()]
