"""``core.busy.database_busy`` on the errors the drivers really raise: a lock, a deadlock's
kind and a lock timeout are "not now"; a value a column refuses, a constraint, a limit are
"not this row" (that row is stripped, the others never)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.db.utils import DataError, IntegrityError, OperationalError

from django_rmq_retry.core.busy import database_busy


def _wrapped(kind: type[Exception], cause: BaseException) -> Exception:
    """As Django raises it: its class, the driver's error as ``__cause__``."""
    exc = kind(*cause.args)
    exc.__cause__ = cause
    return exc


def test_sqlite_s_lock_is_busy_and_its_refusals_are_not(tmp_path: Path):
    path = str(tmp_path / "busy.sqlite3")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER NOT NULL UNIQUE)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("INSERT INTO t VALUES (1)")
    holder.execute("ROLLBACK")
    other.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as duplicate:
        other.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as null:
        other.execute("INSERT INTO t VALUES (NULL)")
    assert database_busy(_wrapped(OperationalError, locked.value))
    assert database_busy(locked.value)
    assert not database_busy(_wrapped(IntegrityError, duplicate.value))
    assert not database_busy(_wrapped(IntegrityError, null.value))


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="PostgreSQL's SQLSTATEs",
)
def test_postgresql_s_lock_timeout_is_busy_and_its_refusals_are_not():
    import psycopg

    db = connection.settings_dict
    dsn = {"dbname": db["NAME"], "host": db["HOST"], "port": db["PORT"] or None}
    dsn |= {"user": db["USER"], "password": db["PASSWORD"] or None}
    holder = psycopg.connect(**dsn, autocommit=False)
    other = psycopg.connect(**dsn, autocommit=True)
    try:
        holder.execute("CREATE TABLE busy_t (x int NOT NULL UNIQUE, s varchar(3))")
        holder.commit()
        holder.execute("LOCK TABLE busy_t IN ACCESS EXCLUSIVE MODE")
        other.execute("SET lock_timeout = '50ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable) as timeout:
            other.execute("INSERT INTO busy_t VALUES (1, 'a')")
        holder.rollback()
        other.execute("INSERT INTO busy_t VALUES (1, 'a')")
        with pytest.raises(psycopg.errors.UniqueViolation) as duplicate:
            other.execute("INSERT INTO busy_t VALUES (1, 'b')")
        with pytest.raises(psycopg.errors.StringDataRightTruncation) as too_long:
            other.execute("INSERT INTO busy_t VALUES (2, 'long')")
        assert database_busy(_wrapped(OperationalError, timeout.value))
        assert not database_busy(_wrapped(IntegrityError, duplicate.value))
        assert not database_busy(_wrapped(DataError, too_long.value))
    finally:
        holder.rollback()
        other.execute("DROP TABLE IF EXISTS busy_t")
        holder.close()
        other.close()
