"""Whether this app's tables exist, and the one line that says what to do when they don't.

Why: a project that added the app and forgot ``migrate`` got a consumer that held every
failure unacked with "no such table ..." and commands that ended in a raw
``OperationalError``. Commands check :func:`missing_tables_message` before they touch a table, the
consumer :func:`missing_tables` at start, and the system check (database-tagged: only with
``manage.py check --database ALIAS``) :func:`unapplied_migrations`. Nothing here runs at
import time; each call costs one introspection query (or reading the migration files).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router

APP_LABEL = "django_rmq_retry"
MIGRATE = f"manage.py migrate {APP_LABEL}"


def never_migrated(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether none of this app's tables exists in ``using`` (``migrate`` never ran for it),
    as opposed to some missing (an upgrade whose new migrations are not applied yet)."""
    ours = _ours(using)
    return bool(ours) and len(missing_tables(using)) == len(ours)


def _ours(using: str) -> list[Any]:
    """This app's models whose tables belong in database ``using``."""
    return [
        m
        for m in apps.get_app_config(APP_LABEL).get_models()
        if m._meta.managed and router.allow_migrate_model(using, m)
    ]


def missing_tables(using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """This app's tables that database ``using`` should hold (its router allows them
    there) and does not. A database that cannot be asked returns ``[]``: the caller's next
    query reports the outage itself."""
    models = _ours(using)
    if not models:
        return []
    try:
        with connections[using].cursor() as cursor:
            present = set(connections[using].introspection.table_names(cursor))
    except DatabaseError:
        return []
    return [m._meta.db_table for m in models if m._meta.db_table not in present]


def missing_tables_message(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """One line naming the migrate command, or ``None`` when every table is there."""
    missing = missing_tables(using)
    if not missing:
        return None
    where = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"
    if len(missing) == len(_ours(using)):
        what = f"The tables of django_rmq_retry do not exist in database '{using}'"
    else:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        what = f"{len(missing)} table(s) of django_rmq_retry are missing in database '{using}' ({shown})"
    return f"{what}: run `{MIGRATE}{where}`."


def unapplied_migrations(using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Names of this app's migrations not applied on ``using`` (reads the migration files
    and the ``django_migrations`` table)."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[using])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
    plan = executor.migration_plan(targets)
    return [migration.name for migration, backwards in plan if migration.app_label == APP_LABEL]
