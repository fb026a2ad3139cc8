"""What ``manage.py rmq_consume --list`` prints: the broker, each receiver's queue,
bindings and retry policy as the consumer would use them (a policy row in the database
first), the retry topology, and the queues no receiver owns. Apart from the command, which
runs the consumer: this only reads.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

from django_rmq_retry import broker
from django_rmq_retry.conf import app_settings, broker_urls, current_levels, current_names
from django_rmq_retry.core.errors import BrokerUnavailable, TopologyError
from django_rmq_retry.core.topology_plan import QUORUM_DELIVERY_LIMIT
from django_rmq_retry.management import orphans
from django_rmq_retry.registry import Receiver
from django_rmq_retry.registry.policies import policy_cache

#: What each jitter does to the capped delay of ``Policy.schedule()`` (core/backoff.py).
JITTER_TEXT = {
    "full": "full jitter: each a random time between 0 and that",
    "equal": "equal jitter: each a random time between half of that and that",
}


def _delays(policy: Any) -> str:
    """The retry delays as ``--list`` shows them: with jitter, the caps ("up to")."""
    sched = ", ".join(f"{d:g}s" for d in policy.schedule())
    if not sched:
        return "no retry"
    jitter = JITTER_TEXT.get(policy.jitter)
    return f"delays up to {sched} ({jitter})" if jitter else f"delays {sched} (no jitter)"


def write(out: Any, style: Any, receivers: list[Receiver]) -> None:
    """The whole listing, to ``out`` (a command's stdout), headings in ``style``."""
    names = current_names()
    levels = current_levels()
    out.write(f"Broker:        {', '.join(broker.mask_url(u) for u in broker_urls())}")
    out.write(f"Work exchange: {names.work_exchange} (topic)")
    out.write(f"Queue type:    {app_settings.QUEUE_TYPE}")
    out.write("")
    if not receivers:
        out.write("No receivers registered.")
    for rec in receivers:
        policy = policy_cache.for_receiver(rec)  # database row > code > settings
        out.write(style.MIGRATE_HEADING(rec.name))
        out.write(f"  queue:    {rec.queue_name(names.prefix)}")
        out.write(
            f"  bindings: {', '.join(rec.routing_keys)} on {names.work_exchange}; "
            f"{names.target_header}={rec.queue_name(names.prefix)} on {names.deliver_exchange}"
        )
        out.write(f"  retry:    {policy.max_attempts} attempts, {_delays(policy)}")
    out.write("")
    out.write(style.MIGRATE_HEADING("Retry topology"))
    out.write(
        f"  {levels.levels} delay levels, resolution {levels.resolution_ms} ms, longest "
        f"delay {levels.max_delay_ms / 1000:,.1f}s ({levels.max_delay_ms / 86_400_000:.1f} days)"
    )
    for k in reversed(range(levels.levels)):
        nxt = names.delay_exchange(k - 1) if k else names.deliver_exchange
        out.write(f"  {names.delay_queue(k)}: TTL {levels.ttl_ms(k) / 1000:g}s → {nxt}")
    out.write(
        f"  {names.deliver_exchange} (headers on {names.target_header}) → receiver queue; "
        f"unroutable → {names.orphan_exchange} → {names.orphan_queue} (parked)"
    )
    if app_settings.QUEUE_TYPE == "quorum":
        out.write(
            f"  quorum queues: given back over {QUORUM_DELIVERY_LIMIT} times → "
            f"{names.dead_exchange} → {names.dead_queue} (parked as delivery_limit)"
        )
    _orphans(out, style)


def _orphans(out: Any, style: Any) -> None:
    """Queues this project declared that no receiver owns (``rmq_orphans``)."""
    try:
        found = orphans.find()
    except (BrokerUnavailable, TopologyError, DatabaseError) as exc:
        out.write(f"\nOrphan queues: not checked ({exc})")
        return
    if found:
        out.write("")
        out.write(style.WARNING("Orphan queues (no receiver owns them; rmq_orphans)"))
        for orphan in found:
            out.write(f"  {orphans.describe(orphan)}")
