"""``manage.py rmq_setup``: declare the whole topology, as a deploy step of its own.

Declaring needs RabbitMQ's configure permission; publishers then need write only and
consumers read and write (docs/howto/permissions.md). Idempotent: run it on every deploy,
before the new code's consumers and publishers start (a new receiver's queue exists before
the first message for it is sent).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rmq_retry import broker
from django_rmq_retry.conf import broker_urls, current_plan
from django_rmq_retry.core.errors import BrokerUnavailable, TopologyError
from django_rmq_retry.core.topology_plan import Plan
from django_rmq_retry.management import orphans
from django_rmq_retry.management.arguments import select_receivers
from django_rmq_retry.management.preflight import require_tables
from django_rmq_retry.registry import Receiver


class Command(BaseCommand):
    help = (
        "Declare every exchange, queue and binding of the receivers (all by default) and the "
        "retry topology, then exit. Needs configure permission; publishers then need write "
        "permission only."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "receivers",
            nargs="*",
            help="Receiver dotted paths or queue names (default: every registered receiver).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_tables()  # it records what it declared (orphan queues are told from that)
        receivers = select_receivers(options["receivers"])
        plan = current_plan(receivers)
        try:
            conn = broker.connect()
        except BrokerUnavailable as exc:
            raise CommandError(str(exc)) from None
        try:
            conn.channel().declare(plan)
        except TopologyError as exc:
            raise CommandError(str(exc)) from None
        finally:
            conn.close()
        orphans.record(receivers)
        self._report(plan, receivers, options["verbosity"])
        for orphan in orphans.find():
            self.stdout.write(self.style.WARNING(f"orphan queue {orphans.describe(orphan)}"))

    def _report(self, plan: Plan, receivers: list[Receiver], verbosity: int) -> None:
        """What was declared: every receiver queue always, the rest with -v 2."""
        out = self.stdout
        where = ", ".join(broker.mask_url(u) for u in broker_urls())
        bindings = len(plan.exchange_bindings) + sum(len(q.bindings) for q in plan.queues)
        for q in plan.queues:
            if q.receiver is not None:
                keys = ", ".join(b.routing_key for b in q.bindings if b.routing_key)
                out.write(f"queue {q.name} ← {keys} (receiver {q.receiver})")
            elif verbosity >= 2:
                out.write(f"queue {q.name}")
        if verbosity >= 2:
            for name, kind, _args in plan.exchanges:
                out.write(f"exchange {name} ({kind})")
        out.write(
            self.style.SUCCESS(
                f"Declared on {where}: {len(plan.exchanges)} exchanges, {len(plan.queues)} "
                f"queues ({len(receivers)} receiver queue(s)), {bindings} bindings."
            )
        )
