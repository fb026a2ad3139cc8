"""Statements over many rows at the database's pace: one INSERT for many rows where
``bulk_create`` is slow (:func:`insert_rows`), "these primary keys" as one parameter
(:func:`ids_in`), and deletes in keyset batches (:func:`delete_in_batches`).

``bulk_create`` writes one placeholder per value (30 columns × 200 rows: 6,000), which
Django compiles field by field and psycopg parses again for every statement (its cache
takes statements of at most 50 parameters), then quotes value by value in Python: more
CPU per parked row than the whole budget of a consumer parking a flood of failures (see
bench/README.md). On PostgreSQL with psycopg 3 :func:`insert_rows` sends one array per
column instead::

    INSERT INTO t (a, b, ...) SELECT a, b::jsonb, ... FROM unnest($1::varchar(255)[], ...)
    WITH ORDINALITY ... ORDER BY ordinality RETURNING id

bound server-side in binary: the same statement for any batch size, every value dumped
in C, a fraction of that cost per row. Other databases (and psycopg 2) get ``bulk_create``.

A purge of a large table must not hold locks (or grow the transaction log) for minutes, so
deletes go by primary key in batches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from django.db import connections, models, transaction
from django.db.models import Q, QuerySet

try:  # psycopg 3: a cursor of its own binds server-side, whatever Django's cursors do
    import psycopg
except ImportError:  # pragma: no cover - psycopg 2 or no PostgreSQL driver
    psycopg = None  # type: ignore[assignment]


def insert_rows(
    model: type[models.Model], rows: Sequence[Mapping[str, Any]], using: str
) -> list[int]:
    """Insert ``rows`` (field name → the value Django would save) and return their primary
    keys in order. Fields a row leaves out get their default. All or nothing: on PostgreSQL
    one statement, which outside a transaction commits by itself, in one round trip (BEGIN,
    INSERT and COMMIT were three, each a wait for the interpreter lock behind the consumer's
    busy threads when it came back); elsewhere in ``transaction.atomic``. Errors are Django's
    (``IntegrityError``, ``DataError``, ...)."""
    if not rows:
        return []
    connection = connections[using]
    if connection.vendor != "postgresql" or psycopg is None or not _is_psycopg3(connection):
        objs = [model(**row) for row in rows]
        with transaction.atomic(using=using):
            if connection.features.can_return_rows_from_bulk_insert:
                model._default_manager.using(using).bulk_create(objs)
            else:  # one INSERT each (SQLite before 3.35, MySQL): the ids are needed
                for obj in objs:
                    obj.save(force_insert=True, using=using)
        return [obj.pk for obj in objs]
    sql, fields, json_fields = _statement(model, connection.alias)
    params = []
    for field in fields:
        default = field.get_default()
        values = [row.get(field.attname, default) for row in rows]
        if field.attname in json_fields:
            encoder = getattr(field, "encoder", None)
            values = [None if v is None else json.dumps(v, cls=encoder) for v in values]
        params.append(values)
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    # Django's wrapper around it: its errors, query logging, execute wrappers (tracing).
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    with wrap(raw) as cursor:  # type: ignore[arg-type]  # the stubs expect a wrapper
        cursor.execute(sql, params)
        return sorted(row[0] for row in cursor.fetchall())


@lru_cache(maxsize=32)
def _statement(
    model: type[models.Model], alias: str
) -> tuple[str, list[models.Field[Any, Any]], frozenset[str]]:
    connection = connections[alias]
    qn = connection.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    json_fields = frozenset(f.attname for f in fields if isinstance(f, models.JSONField))
    names = [qn(str(f.column)) for f in fields]
    columns = ", ".join(names)
    arrays, picks = [], []
    for f, name in zip(fields, names, strict=True):
        if f.attname in json_fields:  # sent as text, parsed by PostgreSQL
            arrays.append("%b::text[]")
            picks.append(f"{name}::jsonb")
        else:
            arrays.append(f"%b::{f.db_type(connection)}[]")
            picks.append(name)
    pk = qn(model._meta.pk.column)
    # WITH ORDINALITY / ORDER BY: rows go in, and take their ids from the sequence, in the
    # order given, so the ids sorted are the rows' ids in that order.
    sql = (
        f"INSERT INTO {qn(model._meta.db_table)} ({columns}) "
        f"SELECT {', '.join(picks)} FROM unnest({', '.join(arrays)}) "
        f"WITH ORDINALITY AS t({columns}, _n) ORDER BY _n RETURNING {pk}"
    )
    return sql, fields, json_fields


def _is_psycopg3(connection: Any) -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


class _AnyOf(models.Lookup):
    """``lhs = ANY(%s::bigint[])``: a list of keys as one array parameter."""

    lookup_name = "any_of"
    prepare_rhs = False  # the list goes to the driver as it is (an array)

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        lhs, params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s::bigint[])", (*params, list(self.rhs))


def ids_in(ids: Sequence[int], using: str) -> Q:
    """``pk IN (ids)``; on PostgreSQL as one array parameter (``pk = ANY(%s)``) instead of
    a placeholder per id, which Django prepares one by one and psycopg parses again for
    every statement (a requeue names up to a chunk's rows, ``CHUNK_ROWS``, per statement,
    three times).

    ``= ANY(array)``, not ``IN (SELECT unnest(array))``: the planner knows how many keys an
    array holds and goes through the primary key whatever the table's statistics say. With
    the subquery it guesses from statistics: right after many rows were parked (before
    autovacuum analysed them) it can scan every parked row for each batch instead, and a
    requeue's marks then cost what the table holds, not what the batch holds.
    """
    if connections[using].vendor == "postgresql":
        return Q(_AnyOf(models.F("pk"), list(ids)))
    return Q(pk__in=list(ids))


def delete_in_batches(rows: QuerySet[Any], batch_size: int) -> int:
    """Delete ``rows`` ``batch_size`` primary keys at a time; returns how many went."""
    model = rows.model
    total = 0
    last_pk: Any = None
    while True:
        # Keyset: each batch starts after the previous one's last key, so it never walks
        # again over the index entries of rows already deleted (dead until vacuum), which a
        # query for the first rows again would walk at every batch of a large purge.
        batch = rows if last_pk is None else rows.filter(pk__gt=last_pk)
        ids = list(batch.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return total
        last_pk = ids[-1]
        total += model._default_manager.using(rows.db).filter(ids_in(ids, rows.db)).delete()[0]
