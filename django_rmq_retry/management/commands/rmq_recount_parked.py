"""``manage.py rmq_recount_parked``: recompute the kept per-group counts of parked rows."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_rmq_retry import parking
from django_rmq_retry.management.preflight import require_tables


class Command(BaseCommand):
    help = (
        "Recompute the per-group counts the failure-groups page reads (and reinstall the "
        "triggers that keep them). Writes to the parked table wait while it runs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default="default",
            help="Database alias of the parked table (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        require_tables(using)
        if connections[using].vendor not in parking.group_counts.VENDORS:
            raise CommandError(
                "this database keeps no counts (PostgreSQL and SQLite do); "
                "the failure-groups page groups the rows each time"
            )
        started = time.monotonic()
        groups = parking.recount(using)
        self.stdout.write(
            self.style.SUCCESS(
                f"recounted {groups} group(s) in {time.monotonic() - started:.1f} s."
            )
        )
