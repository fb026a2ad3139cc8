"""The first rows of a newest-first list whose filter the newest rows fail.

For ``WHERE <words> ORDER BY parked_at DESC LIMIT 50`` PostgreSQL walks the ``parked_at``
index from the newest row and reads each row until 50 match; when the newest rows are an
incident of other errors that is a heap page per row for a hundred thousand rows. The
full-text index says which rows match, not which are newest. So :func:`newest_first_ids`
reads the list slice by slice, newest first, each slice the next rows by ``parked_at`` (its
bounds read from that index alone):

* the first slice, :data:`FIRST_SLICE` rows, is read row by row (a word the newest rows
  hold is found there, without building the full-text index's bitmap of every match,
  which is costly over a large table);
* each next one is a ``BitmapAnd`` of the filter's indexes and the slice's ``parked_at``
  range, so only matching rows touch the heap. A slice holds at most as many rows as
  ``work_mem`` keeps an exact bitmap of (4 MB: 65,536 heap pages, one per row at worst);
  past that the bitmap turns lossy and every row on its pages is read again.

Slices are disjoint and in the list's order, so their first rows, concatenated, are the
list's first rows: the same rows in the same order.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import connections
from django.db.models import Field, QuerySet

#: The column the list is ordered by, newest first.
COLUMN = "parked_at"
#: Rows of the first slice, read row by row.
FIRST_SLICE = 1_000
#: Rows of the second slice, the first from bitmaps (about what the default 4 MB of
#: ``work_mem`` keeps exact), then each :data:`GROWTH` times the last, up to what
#: ``work_mem`` keeps exact: fewer, bigger slices, as each builds the full-text index's
#: bitmap again; but not bigger at once, as a bigger bitmap costs more to build.
BITMAP_SLICE = 60_000
GROWTH = 4
#: Unless, at the share of rows matching so far, a slice would hold more matches than this
#: (each a heap read): then it is twice the rows that share says the rest needs.
SLICE_MATCHES = 5_000
#: Bytes of ``work_mem`` an exact bitmap spends per heap page (PostgreSQL's tidbitmap entry
#: and its hash slot, 64-bit), and the largest slice whatever ``work_mem`` is.
BITMAP_PAGE_BYTES = 64
MAX_SLICE = 500_000
#: Slices before the rest is left to PostgreSQL's own plan (a word only old rows hold).
MAX_SLICES = 32
#: A filter known to match at most this many rows is read whole, in one statement.
WHOLE = 10_000

if TYPE_CHECKING:  # Field is generic in django-stubs only
    _Order: TypeAlias = list[tuple[Field[Any, Any], bool]]


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
    largest = _largest_slice(queryset.db)
    ids: list[Any] = []
    newer: datetime | None = None  # the slice's upper bound (exclusive)
    size, seen = FIRST_SLICE, 0
    for n in range(MAX_SLICES):
        older = _lower_bound(queryset, newer, size)
        found = _walked_ids(queryset, order, older, stop) if n == 0 else None
        if found is None:
            window = queryset if newer is None else queryset.filter(**{f"{COLUMN}__lt": newer})
            if older is not None:
                window = window.filter(**{f"{COLUMN}__gte": older})
            found = _first_ids(window, order, stop - len(ids))
        ids += found
        if len(ids) >= stop or older is None:
            return ids
        seen += size
        size = min(largest, BITMAP_SLICE if n == 0 else size * GROWTH)
        if len(ids) * size > SLICE_MATCHES * seen:
            size = max(FIRST_SLICE, min(size, 2 * (stop - len(ids)) * seen // len(ids)))
        newer = older
    rest = queryset if newer is None else queryset.filter(**{f"{COLUMN}__lt": newer})
    return ids + list(rest.values_list("pk", flat=True)[: stop - len(ids)])


def _order_fields(queryset: QuerySet[Any]) -> _Order | None:
    """The list's order as (field, descending) pairs, if it is plain fields with
    ``-parked_at`` first (what the slices assume); else ``None``."""
    query = queryset.query
    if query.is_sliced or query.distinct or query.combinator:
        return None
    ordering = query.order_by or (queryset.model._meta.ordering if query.default_ordering else ())
    if not ordering or ordering[0] != f"-{COLUMN}":
        return None
    opts = queryset.model._meta
    fields: _Order = []
    for item in ordering:
        if not isinstance(item, str) or "__" in item or item.lstrip("-") in ("", "?"):
            return None
        name = item.lstrip("-")
        field = opts.pk if name == "pk" else opts.get_field(name)
        if not isinstance(field, Field) or not field.concrete:
            return None
        fields.append((field, item.startswith("-")))
    return fields


def _largest_slice(using: str) -> int:
    """Rows a slice may hold and keep its ``parked_at`` bitmap exact (one heap page per row
    at worst), nine tenths of what ``work_mem`` allows."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_size_bytes(current_setting('work_mem'))")
        work_mem = int(cursor.fetchone()[0])
    return min(MAX_SLICE, work_mem // BITMAP_PAGE_BYTES * 9 // 10)


def _lower_bound(queryset: QuerySet[Any], newer: datetime | None, size: int) -> datetime | None:
    """``parked_at`` of the ``size``-th newest row older than ``newer`` (of the whole table:
    an index-only read of the ``parked_at`` index); ``None`` if fewer rows are left."""
    rows = queryset.model._base_manager.using(queryset.db).order_by(f"-{COLUMN}")
    if newer is not None:
        rows = rows.filter(**{f"{COLUMN}__lt": newer})
    found = list(rows.values_list(COLUMN, flat=True)[size - 1 : size])
    return found[0] if found else None


def _first_ids(queryset: QuerySet[Any], order: _Order, limit: int) -> list[Any]:
    """The first ``limit`` primary keys of ``queryset`` in ``order``: its matching rows found
    as a whole first (a ``MATERIALIZED`` CTE, planned without the ``LIMIT``, so by the
    filter's indexes rather than a walk in the list's order), then sorted."""
    fields = _fields(queryset, order)
    inner = queryset.order_by().values_list(*(field.name for field in fields))
    sql, params = inner.query.get_compiler(using=queryset.db).as_sql()
    return _fetch(
        queryset.db,
        f"WITH m AS MATERIALIZED ({sql}) SELECT * FROM m ORDER BY {_by(fields, order)} LIMIT %s",
        [*params, limit],
    )


def _walked_ids(
    queryset: QuerySet[Any], order: _Order, older: datetime | None, limit: int
) -> list[Any] | None:
    """As :func:`_first_ids` for the rows from ``older`` on, each read and tested: the
    filter applies to a subquery of the range (``OFFSET 0`` keeps PostgreSQL from merging
    them), so no other index can serve it. ``None`` if the filter needs a join."""
    query = queryset.query
    if len(query.alias_map) > 1:
        return None
    model, db = queryset.model, queryset.db
    qn = connections[db].ops.quote_name
    table = qn(model._meta.db_table)  # the filter's alias: the subquery takes its name
    rows = model._base_manager.using(db).order_by()
    if older is not None:
        rows = rows.filter(**{f"{COLUMN}__gte": older})
    range_sql, range_params = rows.query.get_compiler(using=db).as_sql()
    try:
        where, params = query.get_compiler(using=db).compile(query.where)
        where = f" WHERE {where}"
    except EmptyResultSet:
        return []
    except FullResultSet:
        where, params = "", []
    fields = _fields(queryset, order)
    columns = ", ".join(f"{table}.{qn(str(field.column))}" for field in fields)
    return _fetch(
        db,
        f"SELECT {columns} FROM ({range_sql} OFFSET 0) AS {table}{where} "
        f"ORDER BY {_by(fields, order)} LIMIT %s",
        [*range_params, *params, limit],
    )


def _fields(queryset: QuerySet[Any], order: _Order) -> list[Field[Any, Any]]:
    """The primary key, then the order's other fields: the columns a slice query returns."""
    pk = queryset.model._meta.pk
    assert pk is not None
    return list(dict.fromkeys([pk, *(field for field, _ in order)]))


def _by(fields: list[Field[Any, Any]], order: _Order) -> str:
    """``ORDER BY`` by position among ``fields`` (the inner query's names for its columns
    are the compiler's to choose)."""
    return ", ".join(f"{fields.index(f) + 1} {'DESC' if desc else 'ASC'}" for f, desc in order)


def _fetch(using: str, sql: str, params: list[Any]) -> list[Any]:
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]
