"""``manage.py rmq_orphans``: name (and on request delete) receiver queues no receiver owns."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry import broker
from django_rmq_retry.core.errors import BrokerUnavailable, TopologyError
from django_rmq_retry.management import orphans


class Command(BaseCommand):
    help = (
        "List the receiver queues this project declared under PREFIX that no registered "
        "receiver owns any more (a receiver renamed or moved without queue=). They stay bound "
        "to their routing keys and fill for ever. --delete removes the empty ones."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--delete",
            action="store_true",
            help="Delete the orphan queues that hold no message (needs configure permission).",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="With --delete: delete orphans that hold messages too (they are lost).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["force"] and not options["delete"]:
            raise CommandError("--force goes with --delete.")
        try:
            conn = broker.connect()
        except BrokerUnavailable as exc:
            raise CommandError(str(exc)) from None
        try:
            found = orphans.find(conn)
            if not found:
                self.stdout.write("No orphan queues.")
                return
            kept = 0
            for orphan in found:
                line = orphans.describe(orphan)
                if not options["delete"]:
                    self.stdout.write(line)
                elif orphans.delete(orphan, force=options["force"], connection=conn):
                    self.stdout.write(self.style.SUCCESS(f"deleted {line}"))
                else:
                    kept += 1
                    self.stdout.write(self.style.WARNING(f"kept (not empty) {line}"))
        except TopologyError as exc:
            raise CommandError(str(exc)) from None
        finally:
            conn.close()
        if not options["delete"]:
            self.stdout.write(
                f"{len(found)} orphan queue(s). Move their messages if they matter (a shovel, "
                "or give the renamed receiver queue=<old name>), then --delete."
            )
        elif kept:
            self.stdout.write(
                f"{kept} kept: they hold messages. Move them first, or --delete --force."
            )
