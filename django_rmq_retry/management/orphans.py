"""Receiver queues nobody owns any more: a receiver renamed or moved without ``queue=``.

A receiver's queue is named after its dotted path unless ``queue=`` names it. Rename the
function or move its module and the next start declares a new queue; the old one stays,
bound to the same routing keys, and fills with a copy of every message for ever. RabbitMQ's
AMQP cannot list queues (only the management plugin's HTTP API can, and a production app
may not reach it), so the app remembers the receiver queues it declared in the database
(:class:`~.models.DeclaredQueue`, written by ``rmq_setup`` and ``rmq_consume`` at start) and
asks the broker about each one it no longer owns (a passive declare: messages, consumers).

Reported by ``rmq_orphans``, ``rmq_consume --list`` and a warning when a consumer starts;
deleted only by ``rmq_orphans --delete`` (never by itself). Queues declared before this
was recorded (or by another project database) are not known: docs/howto/orphan-queues.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import DatabaseError
from django.utils import timezone

from .. import broker
from ..conf import current_names, ordering_partitions
from ..core.errors import RmqRetryError
from ..core.topology_plan import receiver_queues
from ..models import DeclaredQueue
from ..registry import Receiver, default_registry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Orphan:
    name: str
    receiver: str  # the receiver that owned it (its dotted path then)
    messages: int
    consumers: int


def owned_queues(rec: Receiver, prefix: str) -> list[str]:
    """The queues ``rec`` is consumed from: its queue, or an ordered receiver's partition
    queues under the current ``ORDERING_PARTITIONS`` (a receiver made ordered leaves its
    plain queue behind, and fewer partitions leave the last ones: both fill, unread)."""
    return receiver_queues(rec, prefix, ordering_partitions())


def record(receivers: Iterable[Receiver]) -> None:
    """Remember the receiver queues of ``receivers`` under the current PREFIX as declared."""
    prefix = current_names().prefix
    now = timezone.now()
    for rec in receivers:
        for name in owned_queues(rec, prefix):
            DeclaredQueue.objects.update_or_create(
                name=name,
                defaults={"prefix": prefix, "receiver": rec.name, "declared_at": now},
            )


def find(connection: broker.Connection | None = None) -> list[Orphan]:
    """Remembered queues under PREFIX that no registered receiver owns and that still exist
    on the broker. A remembered queue the broker no longer has is forgotten."""
    prefix = current_names().prefix
    owned = {name for rec in default_registry.all() for name in owned_queues(rec, prefix)}
    candidates = list(
        DeclaredQueue.objects.filter(prefix=prefix).exclude(name__in=owned).order_by("name")
    )
    if not candidates:
        return []
    from ..broker.topology import queue_state

    conn = connection or broker.connect()
    try:
        channel = conn.channel().raw
        found = []
        for row in candidates:
            state = queue_state(channel, row.name)
            if state is None:
                row.delete()
                continue
            found.append(Orphan(row.name, row.receiver, *state))
        return found
    finally:
        if connection is None:
            conn.close()


def delete(orphan: Orphan, *, force: bool, connection: broker.Connection) -> bool:
    """Delete ``orphan``'s queue: only while empty unless ``force`` (its messages are lost).
    Returns whether it was deleted. Its record goes with it."""
    from ..broker.topology import delete_queue

    deleted = delete_queue(connection.channel().raw, orphan.name, if_empty=not force)
    if deleted:
        DeclaredQueue.objects.filter(name=orphan.name).delete()
    return deleted


def describe(orphan: Orphan) -> str:
    return (
        f"{orphan.name}: {orphan.messages} message(s), {orphan.consumers} consumer(s); "
        f"was the queue of {orphan.receiver}"
    )


def warn_at_start(receivers: Iterable[Receiver]) -> list[Orphan]:
    """At consumer start: remember ``receivers``' queues, then log a warning naming each
    orphan. Never fails the start (the database or broker may be down: the consumer copes)."""
    try:
        record(receivers)
        orphans = find()
    except (DatabaseError, RmqRetryError) as exc:
        logger.debug("orphan queue check skipped: %s", exc)
        return []
    for orphan in orphans:
        logger.warning(
            "orphan queue %s (no receiver owns it; `manage.py rmq_orphans` to review, "
            "--delete to remove)",
            describe(orphan),
        )
    return orphans
