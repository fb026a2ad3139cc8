"""What a command checks before it touches this app's tables."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS

from ..db.tables import missing_tables_message


def require_tables(using: str = DEFAULT_DB_ALIAS) -> None:
    """Raise ``CommandError`` naming ``manage.py migrate django_rmq_retry`` when a table of
    the app is missing (instead of a raw ``OperationalError`` traceback later)."""
    message = missing_tables_message(using)
    if message:
        raise CommandError(message)
