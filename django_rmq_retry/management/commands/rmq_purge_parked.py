"""``manage.py rmq_purge_parked --older-than 30d``: retention for the parked table."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from django_rmq_retry import parking
from django_rmq_retry.management.arguments import parse_duration
from django_rmq_retry.management.preflight import require_tables
from django_rmq_retry.models import ParkedStatus


class Command(BaseCommand):
    help = "Delete parked-message rows older than a given age (requeued and discarded by default)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", required=True, help="Age such as 30d, 12h, 90m or 3600 (seconds)."
        )
        parser.add_argument(
            "--include-parked",
            action="store_true",
            help="Also delete rows still parked (their messages are lost for good).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the rows it would delete; delete none."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_tables()
        try:
            age = parse_duration(options["older_than"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        statuses: list[str] = [str(ParkedStatus.REQUEUED), str(ParkedStatus.DISCARDED)]
        if options["include_parked"]:
            statuses.append(str(ParkedStatus.PARKED))
        count = parking.purge(age, statuses=statuses, dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(
            self.style.SUCCESS(
                f"{verb} {count} row(s) parked before now - {options['older_than']}."
            )
        )
        if count and not options["dry_run"] and connection.vendor == "postgresql":
            self.stdout.write(
                "The table keeps its size on disk: PostgreSQL reuses the freed space for new "
                "rows once (auto)vacuum has passed. To give it back to the system, run "
                "VACUUM FULL on django_rmq_retry_parkedmessage (it locks the table, reads and "
                "writes all of it) or pg_repack (no long lock)."
            )
