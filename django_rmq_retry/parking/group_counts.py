"""Kept per-group counts of the parked-message table: the database keeps them.

Triggers on the parked-message table add and subtract in :class:`~..models.ParkedGroupCount`
as rows are inserted, change status (or group) and are deleted, inside the transaction
that changed them: parking (one row or a group commit), requeue claims and marks, discard,
purge, and any SQL of the project's own. On PostgreSQL the triggers run once per statement
over its transition tables (a 1,000-row batch is one upsert per group touched, in key order
so two writers never deadlock over them); on SQLite once per row. ``TRUNCATE`` fires no
trigger: after one, or to check, :func:`recount` (``manage.py rmq_recount_parked``)
recomputes every count and reinstalls the triggers.

Other databases get no triggers: :func:`counts_kept` is False there and the failure-groups
page groups the rows each time, as before. It is False too while the triggers are missing
(on SQLite a migration that rebuilds the parked table drops them): the page groups the rows,
right but slow, and the consumer says at start to run ``rmq_recount_parked``.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connections, transaction

PARKED = "django_rmq_retry_parkedmessage"
GROUPS = "django_rmq_retry_parkedgroupcount"
KEY = "receiver, fingerprint, error_type, status"
VENDORS = ("postgresql", "sqlite")

# PostgreSQL: one function per event, each an upsert of the statement's changes by group.
_PG_UPSERT = f"""
    INSERT INTO {GROUPS} AS g ({KEY}, count, last_parked_at)
    SELECT {KEY}, sum(n), max(at) FROM ({{rows}}) AS d
    GROUP BY {KEY} HAVING sum(n) <> 0 ORDER BY {KEY}
    ON CONFLICT ({KEY}) DO UPDATE SET count = g.count + EXCLUDED.count,
        last_parked_at = GREATEST(g.last_parked_at, EXCLUDED.last_parked_at);
"""
_PG_ROWS = {
    "insert": f"SELECT {KEY}, 1 AS n, parked_at AS at FROM new_rows",
    "update": f"SELECT {KEY}, 1 AS n, parked_at AS at FROM new_rows UNION ALL "
    f"SELECT {KEY}, -1, NULL FROM old_rows",
    "delete": f"SELECT {KEY}, -1 AS n, NULL::timestamptz AS at FROM old_rows",
}
_PG_REFERENCING = {
    "insert": "REFERENCING NEW TABLE AS new_rows",
    "update": "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
    "delete": "REFERENCING OLD TABLE AS old_rows",
}


def _pg_install() -> list[str]:
    sql = []
    for event, rows in _PG_ROWS.items():
        name = f"rmqr_groups_{event}"
        sql.append(
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN {_PG_UPSERT.format(rows=rows)} RETURN NULL; END $$"
        )
        sql.append(f"DROP TRIGGER IF EXISTS {name} ON {PARKED}")
        sql.append(
            f"CREATE TRIGGER {name} AFTER {event.upper()} ON {PARKED} "
            f"{_PG_REFERENCING[event]} FOR EACH STATEMENT EXECUTE FUNCTION {name}()"
        )
    return sql


# SQLite: row triggers. A delete only lowers an existing count (never creates one): a flush
# that empties the counts before the rows leaves no negative rows behind.
_SQLITE_ADD = f"""
    INSERT INTO {GROUPS} ({KEY}, count, last_parked_at)
    VALUES (NEW.receiver, NEW.fingerprint, NEW.error_type, NEW.status, 1, NEW.parked_at)
    ON CONFLICT ({KEY}) DO UPDATE SET count = count + 1,
        last_parked_at = max(coalesce(last_parked_at, excluded.last_parked_at),
                             excluded.last_parked_at);
"""
_SQLITE_SUB = f"""
    UPDATE {GROUPS} SET count = count - 1 WHERE receiver = OLD.receiver
        AND fingerprint = OLD.fingerprint AND error_type = OLD.error_type
        AND status = OLD.status;
"""
_SQLITE_CHANGED = (
    "OLD.status IS NOT NEW.status OR OLD.receiver IS NOT NEW.receiver "
    "OR OLD.fingerprint IS NOT NEW.fingerprint OR OLD.error_type IS NOT NEW.error_type"
)


def _sqlite_install() -> list[str]:
    return [
        *_sqlite_uninstall(),
        f"CREATE TRIGGER rmqr_groups_insert AFTER INSERT ON {PARKED} BEGIN {_SQLITE_ADD} END",
        f"CREATE TRIGGER rmqr_groups_update AFTER UPDATE OF {KEY} ON {PARKED} "
        f"WHEN {_SQLITE_CHANGED} BEGIN {_SQLITE_SUB} {_SQLITE_ADD} END",
        f"CREATE TRIGGER rmqr_groups_delete AFTER DELETE ON {PARKED} BEGIN {_SQLITE_SUB} END",
    ]


def _sqlite_uninstall() -> list[str]:
    return [f"DROP TRIGGER IF EXISTS rmqr_groups_{event}" for event in _PG_ROWS]


#: Seconds a look at the database's triggers is trusted (a per-process cache).
TRIGGERS_CHECKED_FOR = 60.0
_triggers_seen: dict[str, tuple[float, bool]] = {}  # alias -> (when, all three there)


def counts_kept(using: str = "default") -> bool:
    """True where triggers keep :class:`ParkedGroupCount` (PostgreSQL and SQLite) and all
    three are in place (checked at most once a minute per process)."""
    if connections[using].vendor not in VENDORS:
        return False
    now = time.monotonic()
    seen = _triggers_seen.get(using)
    if seen is None or now - seen[0] > TRIGGERS_CHECKED_FOR:
        seen = (now, triggers_installed(using))
        _triggers_seen[using] = seen
    return seen[1]


def triggers_installed(using: str = "default") -> bool:
    """Whether the parked table has its three count-keeping triggers (asked each time)."""
    connection = connections[using]
    names = [f"rmqr_groups_{event}" for event in _PG_ROWS]
    marks = ", ".join(["%s"] * len(names))
    if connection.vendor == "postgresql":
        sql = (
            f"SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname IN ({marks})"
        )
    elif connection.vendor == "sqlite":
        sql = (
            f"SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s "
            f"AND name IN ({marks})"
        )
    else:
        return False
    with connection.cursor() as cursor:
        cursor.execute(sql, [PARKED, *names])
        return int(cursor.fetchone()[0]) == len(_PG_ROWS)


def install_sql(vendor: str) -> list[str]:
    """The statements that create (or replace) the triggers on ``vendor``'s database."""
    return {"postgresql": _pg_install, "sqlite": _sqlite_install}.get(vendor, list)()


def fill(cursor: Any) -> int:
    """Replace every count by one computed from the rows. Returns the groups written."""
    cursor.execute(f"DELETE FROM {GROUPS}")
    cursor.execute(
        f"INSERT INTO {GROUPS} ({KEY}, count, last_parked_at) "
        f"SELECT {KEY}, count(*), max(parked_at) FROM {PARKED} GROUP BY {KEY}"
    )
    return int(cursor.rowcount)


def recount(using: str = "default") -> int:
    """Recompute every count (and reinstall the triggers) in one transaction.

    On PostgreSQL the parked table is locked ``SHARE`` meanwhile: reads go on, writes
    (parking, requeue marks) wait for the recount, a few seconds at ten million rows.
    Returns the number of groups.
    """
    connection = connections[using]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"LOCK TABLE {PARKED} IN SHARE MODE")
        for sql in install_sql(connection.vendor):
            cursor.execute(sql)
        groups = fill(cursor)
    _triggers_seen.pop(using, None)
    return groups
