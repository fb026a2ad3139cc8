"""``manage.py rmq_requeue``: put parked messages back to work (same service as the admin)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry import parking
from django_rmq_retry.core.errors import PublishError
from django_rmq_retry.management.filters import add_filter_arguments, filtered_queryset
from django_rmq_retry.management.progress import Progress


class Command(BaseCommand):
    help = "Requeue parked messages matching the filters, in batches, with publisher confirms."

    def add_arguments(self, parser: CommandParser) -> None:
        add_filter_arguments(parser)
        parser.add_argument(
            "--to-topic",
            action="store_true",
            help="Republish to the work exchange with the original routing key "
            "(ALL receivers of the topic get it), not just the failed receiver.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would be requeued.")
        parser.add_argument("--limit", type=int, help="Requeue at most this many rows.")
        parser.add_argument("--batch-size", type=int, help="Rows per batch (default: BATCH_SIZE).")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            qs = filtered_queryset(options)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        total = parking.requeue(qs, dry_run=True, limit=options["limit"]).matched
        if options["dry_run"]:
            self.stdout.write(f"{total} parked message(s) would be requeued.")
            return
        if total == 0:
            self.stdout.write("Nothing to requeue.")
            return
        bar = Progress(
            self.stderr,
            total,
            label="requeue",
            enabled=not options["no_progress"] and options["verbosity"] >= 1,
        )

        def progress(result: parking.RequeueResult, *, last: bool = False) -> None:
            done = result.requeued + result.failed + result.skipped
            detail = f"requeued {result.requeued:,} failed {result.failed:,}"
            if last:
                bar.close(done, detail)
            else:
                bar.update(done, detail)

        try:
            result = parking.requeue(
                qs,
                user="cli",
                mode=parking.MODE_TOPIC if options["to_topic"] else parking.MODE_RECEIVER,
                limit=options["limit"],
                batch_size=options["batch_size"],
                progress=progress,
            )
        except PublishError as exc:
            bar.close()
            raise CommandError(f"{exc}. Nothing claimed is lost: run the command again.") from None
        progress(result, last=True)
        for line in result.errors:
            self.stderr.write(line)
        self.stdout.write(
            self.style.SUCCESS(
                f"Requeued {result.requeued}, failed {result.failed}, skipped {result.skipped} "
                f"(taken by another requeue)."
            )
        )
        if result.failed:
            raise CommandError(
                f"{result.failed} message(s) could not be requeued; they stay parked."
            )
