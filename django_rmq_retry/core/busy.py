"""Which database errors mean "not now" rather than "not this row". Pure: reads attributes.

Parking tells two failures apart. A database that cannot write *now* (another writer holds
SQLite's lock past its timeout, a deadlock or serialization failure, a lock timeout, a full
disk, a server shutting down) must get the same batch again later: the parking thread holds
it unacked and retries with backoff. A database that refuses *this row* (a value a column or
a trigger will not take) gets it row by row and, if still refused, stripped of its headers
and properties. A lock once looked like a refusal (a plain ``SELECT 1`` still answers under
SQLite's write lock), and rows were stripped for it.

Django wraps the driver's exception (``__cause__``): psycopg's carries the SQLSTATE
(``sqlstate``, ``pgcode`` in psycopg2), Python 3.11's sqlite3 its result code's name.
"""

from __future__ import annotations

#: SQLSTATE classes and codes of "not now": connection exceptions (08), transaction
#: rollbacks (40: serialization failure, deadlock), insufficient resources (53: disk full,
#: out of memory, too many connections), lock not available (55P03), operator intervention
#: (57: statement timeout, server shutting down).
_SQLSTATES = ("08", "40", "53", "55P03", "57")
#: SQLite's result codes of another connection holding the database or a table.
_SQLITE = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_BUSY_SNAPSHOT"})
#: What sqlite3 says when it names no code (Python before 3.11).
_SQLITE_TEXT = ("database is locked", "database table is locked")


def database_busy(exc: BaseException) -> bool:
    """Whether ``exc`` (or the driver's error it wraps) says the database cannot write now."""
    for err in (exc, exc.__cause__):
        if err is None:
            continue
        state = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if isinstance(state, str) and state.startswith(_SQLSTATES):
            return True
        if getattr(err, "sqlite_errorname", None) in _SQLITE:
            return True
        if any(text in str(err) for text in _SQLITE_TEXT):
            return True
    return False
