"""Queries over the parked-message table that stay cheap at millions of rows.

* :func:`distinct_values`: a column's values read from its index, one probe per value (a
  "loose index scan" as one recursive query), instead of ``SELECT DISTINCT`` over the table.
* :class:`WordsMatch`: whole words of a text column; on PostgreSQL through the full-text
  index of migration 0001 (``to_tsvector('simple', error_message)``), elsewhere a ``LIKE``
  per word (a scan: the clear limit of other databases).
* :func:`group_query`: the admin list's filters for one failure group's parked rows.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import connections
from django.db.models import BooleanField, Expression, F, Q

from ..models import ParkedMessage, ParkedStatus

#: The text-search configuration of the full-text index: words as written, no stemming, no
#: stop words (error messages are not prose), case folded.
TS_CONFIG = "simple"


def distinct_values(
    model: type[Any] = ParkedMessage,
    column: str = "receiver",
    limit: int = 100,
    using: str = "default",
) -> list[Any]:
    """The first ``limit`` distinct values of ``column``, in order, read from its index.

    Each step asks for the smallest value above the previous one (``MIN(col) WHERE col >
    prev``), which an index leading with the column answers in one probe: the cost grows
    with the number of values shown, not with the table. NULLs are left out.
    """
    connection = connections[using]
    qn = connection.ops.quote_name
    table, col = qn(model._meta.db_table), qn(model._meta.get_field(column).column)
    sql = (
        f"WITH RECURSIVE v(x, n) AS ("
        f" SELECT (SELECT MIN({col}) FROM {table}), 1"
        f" UNION ALL"
        f" SELECT (SELECT MIN({col}) FROM {table} WHERE {col} > v.x), v.n + 1"
        f" FROM v WHERE v.x IS NOT NULL AND v.n < %s"
        f") SELECT x FROM v WHERE x IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


def group_query(receiver: str, fingerprint: str, error_type: str) -> dict[str, str]:
    """The admin list's filters (its query string) for one failure group's parked rows: one
    definition for the failure-groups page, the dashboard and the alerts' links."""
    return {
        "status__exact": str(ParkedStatus.PARKED),  # its value: "parked"
        "receiver": receiver,
        "fingerprint": fingerprint,
        "error_type": error_type,
    }


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class WordsMatch(Expression):
    """True when every word of ``words`` is in the text column ``column`` (case ignored).

    PostgreSQL: ``to_tsvector('simple', col) @@ plainto_tsquery('simple', words)``, the
    expression of the GIN index ``rmqr_parked_error_words``. Other databases: one
    ``icontains`` per word (what Django's admin search does), which reads every row.
    """

    output_field = BooleanField()
    conditional = True

    target: Any = None  # the resolved column
    fallback: Any = None  # the resolved icontains filter (other databases)

    def __init__(self, column: str, words: str) -> None:
        super().__init__(output_field=BooleanField())
        self.column = column
        self.words = words

    def resolve_expression(self, query: Any = None, *args: Any, **kwargs: Any) -> Any:
        clone = self.copy()
        clone.is_summary = False
        clone.target = F(self.column).resolve_expression(query, *args, **kwargs)
        clone.fallback = Q(
            *(Q(**{f"{self.column}__icontains": w}) for w in self.words.split())
        ).resolve_expression(query, *args, **kwargs)
        return clone

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        if connection.vendor != "postgresql":
            return compiler.compile(self.fallback)
        sql, params = compiler.compile(self.target)
        # Each word as a substring first (ILIKE, cheap), the full-text test (building the
        # row's tsvector, far costlier) only for rows that pass: when PostgreSQL walks the
        # list's order instead of reading the GIN index, most rows are ruled out cheaply. A
        # whole-word match always contains each word's letters, so this drops no match.
        likes = [f"{sql} ILIKE %s" for _ in self._tokens()]
        like_params = [p for token in self._tokens() for p in (*params, f"%{_escape_like(token)}%")]
        match = (
            f"to_tsvector('{TS_CONFIG}'::regconfig, {sql}) @@ "
            f"plainto_tsquery('{TS_CONFIG}'::regconfig, %s)"
        )
        return "(" + " AND ".join([*likes, match]) + ")", [*like_params, *params, self.words]

    def _tokens(self) -> list[str]:
        return [t for t in re.split(r"[\W_]+", self.words) if t]

    def get_group_by_cols(self) -> list[Any]:
        return []
