"""``manage.py rmq_purge_inbox --older-than 7d``: retention for idempotent receivers' rows."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry.consumer.inbox import purge_handled
from django_rmq_retry.management.arguments import parse_duration
from django_rmq_retry.management.helptext import from_setting
from django_rmq_retry.management.preflight import require_tables


class Command(BaseCommand):
    help = (
        "Delete handled-message rows of idempotent receivers older than a given age "
        "(default: INBOX_RETENTION_DAYS). A duplicate of a purged message runs again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            help="Age such as 7d, 12h, 90m or 3600 (seconds) "
            f"{from_setting('INBOX_RETENTION_DAYS', ' days')}.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the rows it would delete; delete none."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_tables()
        age = None
        if options["older_than"]:
            try:
                age = parse_duration(options["older_than"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        count = purge_handled(age, dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(self.style.SUCCESS(f"{verb} {count} handled-message row(s)."))
