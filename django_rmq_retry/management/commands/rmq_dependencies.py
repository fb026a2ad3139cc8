"""``manage.py rmq_dependencies``: the dependency breakers, and an operator's open / close."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry.breakers import overview, state
from django_rmq_retry.conf import dependency_limits
from django_rmq_retry.core.breaker import State


class Command(BaseCommand):
    help = (
        "List the dependencies of RMQ_RETRY['DEPENDENCIES'] and their breakers (state, "
        "since, failures in the window, next probe, trips). --open NAME stops every receiver "
        "that depends on it (the broker keeps their messages) until a probe succeeds or "
        "--close NAME; --close NAME closes it now (and replays what it parked)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--open", metavar="NAME", help="Open this dependency's breaker now.")
        what.add_argument("--close", metavar="NAME", help="Close this dependency's breaker now.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            known = dependency_limits()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        name, to = (
            (options["open"], State.OPEN) if options["open"] else (options["close"], State.CLOSED)
        )
        if name:
            if name not in known:
                raise CommandError(
                    f"Unknown dependency {name!r}; RMQ_RETRY['DEPENDENCIES'] defines: "
                    f"{', '.join(sorted(known)) or 'none'}."
                )
            who = f"{_operator()} (rmq_dependencies)"
            if state.force(name, to, who):
                self.stdout.write(self.style.SUCCESS(f"{name}: {to.value} now"))
            else:
                self.stdout.write(f"{name}: already {to.value}")
            return
        views = overview.views()
        if not views:
            self.stdout.write("No dependencies: RMQ_RETRY['DEPENDENCIES'] is empty.")
        for view in views:
            line = overview.describe(view)
            style = self.style.SUCCESS if view.state is State.CLOSED else self.style.WARNING
            self.stdout.write(style(line))


def _operator() -> str:
    """Who runs the command, for the breaker's history (a container may have no user name)."""
    try:
        return getpass.getuser()
    except Exception:
        return "an operator"
