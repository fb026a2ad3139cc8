"""Lock waits with an end: a statement that meets a row another transaction holds waits at
most a given time, then fails (or, with ``SKIP LOCKED``, passes the row by).

PostgreSQL only: its ``lock_timeout``, set for one transaction. SQLite has no row locks;
its one wait, for the database's write lock, is already bounded by the connection's
``timeout`` option (5 s by default).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import DatabaseError, connections, transaction

#: PostgreSQL's SQLSTATE for a lock wait that ran out of time (or a ``NOWAIT`` that met one).
LOCK_NOT_AVAILABLE = "55P03"


def row_locks(using: str) -> bool:
    """Whether the database locks rows (and so may make a statement wait for one)."""
    return connections[using].vendor == "postgresql"


@contextlib.contextmanager
def bounded(using: str, seconds: float | None) -> Iterator[None]:
    """A transaction (a savepoint inside the caller's) in which each statement waits at most
    ``seconds`` for a lock (``None``: as long as it takes). The caller's own setting is
    put back at the end, so a caller's transaction goes on as it was."""
    with transaction.atomic(using=using):
        if seconds is None or not row_locks(using):
            yield
            return
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            (before,) = cursor.fetchone()
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, true)", [f"{max(1, int(seconds * 1000))}ms"]
            )
        try:
            yield
        finally:
            with contextlib.suppress(DatabaseError), connections[using].cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock wait that ran out of time."""
    cause = exc.__cause__ or exc
    return LOCK_NOT_AVAILABLE in (
        getattr(cause, "sqlstate", None),  # psycopg 3
        getattr(cause, "pgcode", None),  # psycopg2
    )
