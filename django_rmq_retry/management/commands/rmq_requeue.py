"""``manage.py rmq_requeue``: put parked messages back to work (same service as the admin)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry import parking
from django_rmq_retry.conf import app_settings
from django_rmq_retry.consumer.operations_runner import OperationsRunner
from django_rmq_retry.core.errors import PublishError
from django_rmq_retry.management.arguments import add_filter_arguments, filtered_queryset
from django_rmq_retry.management.helptext import from_setting
from django_rmq_retry.management.preflight import require_tables
from django_rmq_retry.management.progress import Progress
from django_rmq_retry.models import OperationState, RequeueOperation
from django_rmq_retry.parking import operations

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Requeue parked messages matching the filters, in batches, with publisher confirms. "
        "With no filter, EVERY parked message is requeued: count them first with --dry-run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_filter_arguments(parser)
        parser.add_argument(
            "--to-topic",
            action="store_true",
            help="Republish to the work exchange with the original routing key "
            "(ALL receivers of the topic get it), not just the failed receiver.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would be requeued.")
        parser.add_argument(
            "--limit", type=int, help="Requeue at most this many rows (default: no limit)."
        )
        parser.add_argument(
            "--batch-size", type=int, help=f"Rows per batch {from_setting('BATCH_SIZE')}."
        )
        parser.add_argument(
            "--no-progress",
            action="store_true",
            help="No progress report (default: a bar on a terminal, a line every 5 s elsewhere).",
        )
        group = parser.add_argument_group(
            "background operation",
            "Any of these makes the requeue an operation (as the admin's background requeue): "
            "this command steps it and shows its progress; running consumers step it too. "
            "Ctrl-C pauses it (resume it in the admin or with rmq_operations --resume).",
        )
        group.add_argument(
            "--canary",
            type=int,
            metavar="N",
            help="Send N first; go on once each is handled (stop if one fails again).",
        )
        group.add_argument("--rate", type=float, metavar="R", help="At most R messages a second.")
        group.add_argument(
            "--ramp", action="store_true", help="Batches of 1, 5, 20, 100, 500, each awaited."
        )
        group.add_argument(
            "--stop-on-failure",
            action="store_true",
            help="Stop at the first requeued message that fails again (the rest stays parked).",
        )
        group.add_argument(
            "--detach",
            action="store_true",
            help="Only create the operation; the consumers (or rmq_operations) run it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_tables()
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
        if (
            any((options["canary"], options["rate"], options["ramp"], options["stop_on_failure"]))
            or options["detach"]
        ):
            self._operation(qs, options)
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

    def _operation(self, qs: Any, options: dict[str, Any]) -> None:
        """Create an operation, then step it here until it settles (or Ctrl-C pauses it)."""
        try:
            op = operations.create(
                qs,
                user="cli",
                description="manage.py rmq_requeue",
                mode=parking.MODE_TOPIC if options["to_topic"] else parking.MODE_RECEIVER,
                canary=options["canary"] or 0,
                ramp=options["ramp"],
                rate=options["rate"],
                stop_on_failure=options["stop_on_failure"],
                limit=options["limit"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Requeue operation #{op.pk}: {op.total} message(s).")
        if options["detach"]:
            self.stdout.write("Detached: running consumers (or rmq_operations) will send them.")
            return
        bar = Progress(
            self.stderr,
            op.total,
            label=f"operation #{op.pk}",
            enabled=not options["no_progress"] and options["verbosity"] >= 1,
        )
        stop = threading.Event()
        runner = OperationsRunner(stop, once=True, only=op.pk)
        runner.start()
        try:
            while runner.alive():
                runner.join(0.2)
                op.refresh_from_db()
                p = operations.progress(op)
                bar.update(
                    p.sent,
                    f"handled {p.handled:,} failed again {p.failed_again:,} left {p.left:,}",
                )
        except KeyboardInterrupt:
            bar.close()
            self._interrupted(op, runner, stop)
            return
        op.refresh_from_db()
        p = operations.progress(op)
        bar.close(p.sent, f"handled {p.handled:,} failed again {p.failed_again:,}")
        rate = f", {p.achieved_rate} msg/s" if p.achieved_rate else ""
        # The reason says the state in words of its own ("Done: ...", "The canary failed:
        # ...", "Cancelled by ..."); the bare state only when there is none.
        said = op.state_reason or f"{op.get_state_display()}."
        line = f"{said} (sent {p.sent}{rate})"
        if op.state == OperationState.DONE:
            self.stdout.write(self.style.SUCCESS(line))
        else:
            raise CommandError(line)

    def _interrupted(
        self, op: RequeueOperation, runner: OperationsRunner, stop: threading.Event
    ) -> None:
        """Ctrl-C: pause the operation, let a step in flight end its batch here (its marks
        commit and its claims are released; its copies count as sent), then say from the
        database what happened. A second Ctrl-C exits at once: a step cut short leaves its
        copies in flight to the lease's expiry (a taker counts them, never sends them again).
        """
        control = operations.pause(op.pk, "cli")
        stop.set()
        wait = float(app_settings.SHUTDOWN_TIMEOUT)
        if runner.alive():
            self.stderr.write(
                f"Pausing operation #{op.pk}: a step in flight stops after its current batch "
                f"(waiting at most {wait:g} s, SHUTDOWN_TIMEOUT). Press Ctrl-C again to exit now."
            )
            try:
                runner.join(wait)
            except KeyboardInterrupt:
                logger.warning("operation #%s: second Ctrl-C, exiting during a step", op.pk)
        op.refresh_from_db()
        p = operations.progress(op)
        counted = (
            f"{p.sent} sent, {p.handled} handled, {p.failed_again} failed again, {p.left} left"
        )
        if runner.alive():
            counted += (
                "; this process's step was cut short: a consumer counts its batch once the "
                "lease expires (never sent twice)"
            )
        if control.ok:
            raise CommandError(
                f"Operation #{op.pk} paused ({counted}). Resume it in the admin or with "
                f"`manage.py rmq_operations --resume {op.pk}`."
            )
        by = f" (by {control.changed_by})" if control.changed_by else ""
        line = (
            f"Operation #{op.pk} was not paused: it is {op.get_state_display().lower()}{by}. "
            f"{op.state_reason} ({counted})"
        )
        if op.state == OperationState.DONE:
            self.stdout.write(self.style.SUCCESS(line))
            return
        raise CommandError(line)
