"""``manage.py rmq_operations``: run, list, pause, resume or cancel background requeues.

Consumers (``rmq_consume``, ``rmq_relay``) step operations on their housekeeping thread; this
command does the same for a deployment that wants it in a process of its own, or none.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry.consumer.operations_runner import OperationsRunner
from django_rmq_retry.management.stop_signals import on_stop_signals
from django_rmq_retry.models import RequeueOperation
from django_rmq_retry.parking import operations


class Command(BaseCommand):
    help = "Step background requeue operations (or list, pause, resume, cancel one)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once", action="store_true", help="Exit once no operation is running."
        )
        parser.add_argument("--list", action="store_true", help="List the latest operations.")
        parser.add_argument("--pause", type=int, metavar="ID", help="Pause the operation ID.")
        parser.add_argument(
            "--resume", type=int, metavar="ID", help="Resume the paused operation ID."
        )
        parser.add_argument(
            "--cancel",
            type=int,
            metavar="ID",
            help="Cancel the operation ID (what it sent stays sent).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for verb in ("pause", "resume", "cancel"):
            if options[verb] is not None:
                done = getattr(operations, verb)(options[verb], "cli")
                if not done:
                    now = f"it is {done.state} (by {done.changed_by or '?'})" if done.state else ""
                    raise CommandError(
                        f"operation #{options[verb]} cannot {verb}: {now or 'no such operation'}"
                    )
                past = {"pause": "paused", "resume": "resumed", "cancel": "cancelled"}[verb]
                self.stdout.write(f"Operation #{options[verb]}: {past}.")
                return
        if options["list"]:
            for op in RequeueOperation.objects.order_by("-created_at")[:20]:
                p = operations.progress(op)
                self.stdout.write(
                    f"#{op.pk} {op.state:9} by {op.created_by}: {p.sent}/{p.total} sent, "
                    f"{p.handled} handled, {p.failed_again} failed again. {op.state_reason}"
                )
            return
        stop = threading.Event()
        runner = OperationsRunner(stop, once=options["once"])
        restore = on_stop_signals(lambda _signum: stop.set())
        try:
            runner.run()
        finally:
            restore()
        self.stdout.write(f"Stopped after {runner.steps} step(s).")
