"""Daemon threads that may use the database.

Django's connections belong to the thread that opened them, so a thread that touched the
database must close its own when it ends: left open, they outlive the thread (PostgreSQL
then counts them against the database, and refuses to drop a test database over them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connections


def start_daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` on a daemon thread that closes its database connections at the end."""

    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()  # this thread's own connections only

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
