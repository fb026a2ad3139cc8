"""``manage.py rmq_doctor``: is this broker, and this user on it, fit for this code?

Run it before and after a broker upgrade, and in CI against each broker: it reads the
broker's version, the binding keys, the permissions of the configured user for what each
process does, the topology's arguments against the code's and orphan queues
(``management.doctor``). Exit status 0 when all is well; else one line per problem with
its fix, and status 1.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry.core.errors import RmqRetryError
from django_rmq_retry.management import doctor
from django_rmq_retry.management.arguments import select_receivers


class Command(BaseCommand):
    help = (
        "Check the broker and the configured user before or after an upgrade: version floors, "
        "binding keys, deprecated features, permissions, topology drift, orphan queues. Exit "
        "status 1 with one line per problem and its fix."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "receivers",
            nargs="*",
            help="Receiver dotted paths or queue names (default: every registered receiver).",
        )
        parser.add_argument(
            "--role",
            action="append",
            choices=doctor.ROLES,
            help=(
                "What the configured user must be able to do (repeatable): send (web "
                "processes), consume (rmq_consume), setup (rmq_setup; also compares the "
                "topology's arguments). Default: send and consume."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        roles = options["role"] or ["send", "consume"]
        receivers = select_receivers(options["receivers"])
        try:
            findings = doctor.examine(receivers, list(dict.fromkeys(roles)))
        except RmqRetryError as exc:
            raise CommandError(f"cannot examine the broker: {exc}") from None
        problems = [f for f in findings if not f.ok]
        for finding in findings:
            if finding.ok:
                if options["verbosity"] >= 1:
                    self.stdout.write(finding.line())
            else:
                self.stdout.write(self.style.ERROR(finding.line()))
        if problems:
            raise CommandError(f"{len(problems)} problem(s) found")
        self.stdout.write(self.style.SUCCESS("No problem found."))
