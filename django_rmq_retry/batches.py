"""Deleting many rows without one long statement: a purge of a large table must not hold
locks (or grow the transaction log) for minutes, so it goes by primary key in batches."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet


def delete_in_batches(rows: QuerySet[Any], batch_size: int) -> int:
    """Delete ``rows`` ``batch_size`` primary keys at a time; returns how many went."""
    model = rows.model
    total = 0
    last_pk: Any = None
    while True:
        # Keyset: each batch starts after the previous one's last key, so it never walks
        # again over the index entries of rows already deleted (dead until vacuum): at
        # 200,000 rows the first-rows-again query made a purge 3x slower (#16).
        batch = rows if last_pk is None else rows.filter(pk__gt=last_pk)
        ids = list(batch.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return total
        last_pk = ids[-1]
        total += model._default_manager.using(rows.db).filter(pk__in=ids).delete()[0]
