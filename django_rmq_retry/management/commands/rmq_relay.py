"""``manage.py rmq_relay``: the outbox relay on its own, for projects that publish but do
not consume (``rmq_consume`` runs the same relay beside its receivers)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_rmq_retry import broker
from django_rmq_retry.conf import broker_urls
from django_rmq_retry.consumer.housekeeper import Housekeeper
from django_rmq_retry.management.helptext import setting_value
from django_rmq_retry.management.preflight import require_tables
from django_rmq_retry.management.stop_signals import on_stop_signals
from django_rmq_retry.models import OutboxMessage
from django_rmq_retry.outbox import release_held


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
        if options["verbosity"] >= 1 and not options["once"]:
            urls = ", ".join(broker.mask_url(u) for u in broker_urls())
            self.stdout.write(
                f"Relaying the outbox of database '{options['database']}' to {urls}. "
                "Ctrl-C or SIGTERM stops after the rows being published are confirmed."
            )

        def on_signal(signum: int) -> None:
            if not stop.is_set() and options["verbosity"] >= 1:
                # a signal handler: a write it interrupted must not become a crash
                with contextlib.suppress(RuntimeError, OSError, ValueError):
                    self.stdout.write(
                        f"{signal.Signals(signum).name}: stopping once the rows being "
                        "published are confirmed (committed rows not yet published stay for "
                        "the next relay)."
                    )
            stop.set()

        restore = on_stop_signals(on_signal)
        try:
            keeper.run()
        finally:
            restore()
        self.stdout.write(
            self.style.SUCCESS(
                f"Stopped: {keeper.published} published, {keeper.held} held for an operator."
            )
        )
