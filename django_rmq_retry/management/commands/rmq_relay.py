"""``manage.py rmq_relay``: the outbox relay on its own, for projects that publish but do
not consume (``rmq_consume`` runs the same relay beside its receivers)."""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_rmq_retry.consumer.housekeeper import Housekeeper
from django_rmq_retry.management.helptext import setting_value
from django_rmq_retry.management.preflight import require_tables
from django_rmq_retry.models import OutboxMessage
from django_rmq_retry.outbox import release_held
from django_rmq_retry.stop_signals import on_stop_signals


class Command(BaseCommand):
    help = "Publish committed outbox rows to RabbitMQ (with confirms) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once",
            action="store_true",
            help="Publish what is pending now, then exit (rows waiting after a refusal stay).",
        )
        parser.add_argument(
            "--database",
            default="default",
            help="Database alias of the outbox table (default: %(default)s).",
        )
        parser.add_argument(
            "--release-held",
            action="store_true",
            help="First give held rows (refused OUTBOX_MAX_ATTEMPTS times) new attempts.",
        )
        parser.add_argument(
            "--no-inbox-purge",
            action="store_true",
            help="Do not purge, hourly, the handled-message rows of idempotent receivers "
            f"older than INBOX_RETENTION_DAYS (now {setting_value('INBOX_RETENTION_DAYS')}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_tables(options["database"])
        if options["release_held"]:
            released = release_held(OutboxMessage.objects.using(options["database"]).all())
            self.stdout.write(f"released {released} outbox row(s) for new attempts.")
        stop = threading.Event()
        keeper = Housekeeper(
            stop,
            using=options["database"],
            purge_inbox=not options["no_inbox_purge"],
            once=options["once"],
        )
        restore = on_stop_signals(lambda _signum: stop.set())
        try:
            keeper.run()
        finally:
            restore()
        self.stdout.write(
            self.style.SUCCESS(
                f"Stopped: {keeper.published} published, {keeper.held} held for an operator."
            )
        )
