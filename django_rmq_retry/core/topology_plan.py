"""Every exchange, queue and binding we own, computed without touching the broker. Pure.

The shape (prefix ``p``, N delay levels)::

    Topic.send ─► p.work (topic) ──routing key──► p.<receiver>   (one durable queue each)
    retry      ─► p.delay.K (topic) ─bit K=1─► queue p.delay.K (TTL 2^K·res) ─DLX─► p.delay.K-1
                                    ─bit K=0─► exchange p.delay.K-1 ... ─► p.deliver
    p.deliver (headers, match on p-target = queue name) ─► exactly one receiver queue
              └─ alternate exchange p.orphans (fanout) ─► queue p.orphans (parked by consumers)

An ordered receiver (``ordering_key=``) reads N partition queues instead of one, each with a
single active consumer::

    p.work ──routing key──► exchange p.<receiver>.partitions (headers)
        ── p-partition:p.<receiver> = "k" ──► queue p.<receiver>.pKK   (k = 0 .. N-1)

The publisher sets that header to the partition of the message's key (``core.ordering``);
retries and requeues reach a partition queue through ``p.deliver`` by its own name, as they
reach any receiver queue.

With quorum queues, the receiver queues and ``p.orphans`` also carry an explicit delivery
limit and dead-letter into ``p.dead`` (fanout) ─► queue ``p.dead`` (parked by consumers), so
the broker's limit ends in a parked row instead of a drop (see :data:`QUORUM_DELIVERY_LIMIT`).

``broker.topology.declare`` puts a :class:`Plan` on a real broker, ``testing`` into its
in-memory one, and ``rmq_consume --list`` prints it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .delays import DelayLevels
from .names import Names


class QueueOwner(Protocol):
    """What a plan needs of a receiver (``registry.Receiver`` is one)."""

    name: str

    @property
    def routing_keys(self) -> list[str]: ...

    def queue_name(self, prefix: str) -> str: ...


@dataclass(frozen=True)
class Binding:
    source: str
    routing_key: str = ""
    arguments: dict[str, Any] | None = None


@dataclass(frozen=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any]
    bindings: list[Binding] = field(default_factory=list)
    receiver: str | None = None
    #: No receiver reads it: the consumer parks whatever arrives (orphans, dead letters).
    parks: bool = False


@dataclass(frozen=True)
class Plan:
    """Everything to declare."""

    exchanges: list[tuple[str, str, dict[str, Any]]]  # name, type, arguments
    exchange_bindings: list[tuple[str, str, str]]  # destination, source, routing key
    queues: list[QueueSpec]

    @property
    def parking_queues(self) -> list[str]:
        """Queues every consumer also reads and parks from (see :attr:`QueueSpec.parks`)."""
        return [q.name for q in self.queues if q.parks]


#: Returns of one message (nack, channel closed, consumer shut down with it prefetched) a
#: quorum receiver queue allows before it dead-letters the message to ``p.dead``, where the
#: consumer parks it. Always explicit: RabbitMQ 4.0 otherwise applies 20 and *drops* the
#: message without a dead-letter exchange, and ``-1`` ("no limit" on 4.0) drops after the
#: first return on 3.10. Our ``DELIVERY_LIMIT`` (receiver starts) must stay well below it:
#: it parks first, with the better story; this one bounds every give-back we do not count.
QUORUM_DELIVERY_LIMIT = 1000

#: The same for ``p.dead`` itself, which has nowhere further to go. Its messages are only
#: parked (no receiver runs), so only a million restarts with one of them prefetched reach it.
#: Values of 2^32 and more are dropped after one return on 3.10: stay far below.
DEAD_QUEUE_DELIVERY_LIMIT = 1_000_000


def _queue_args(queue_type: str, dead_exchange: str | None = None) -> dict[str, Any]:
    """Arguments of a queue a consumer reads; ``dead_exchange`` for a quorum queue's limit."""
    if queue_type != "quorum":
        return {}
    if dead_exchange is None:
        return {"x-queue-type": "quorum", "x-delivery-limit": DEAD_QUEUE_DELIVERY_LIMIT}
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": QUORUM_DELIVERY_LIMIT,
        "x-dead-letter-exchange": dead_exchange,
        # the message stays in its queue until p.dead confirmed it (needs reject-publish)
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def is_ordered(rec: QueueOwner) -> bool:
    """Whether ``rec`` keeps per-key order (it was declared with ``ordering_key=``)."""
    return getattr(rec, "ordering_key", None) is not None


def receiver_queues(rec: QueueOwner, prefix: str, partitions: int) -> list[str]:
    """The queues ``rec`` is consumed from: its queue, or its partition queues if ordered."""
    queue = rec.queue_name(prefix)
    if not is_ordered(rec):
        return [queue]
    return [Names.partition_queue(queue, k) for k in range(partitions)]


def plan(
    receivers: Iterable[QueueOwner],
    names: Names,
    levels: DelayLevels,
    queue_type: str,
    partitions: int = 4,
    native_retry: Callable[[QueueOwner], dict[str, Any]] | None = None,
) -> Plan:
    """``native_retry``: the quorum-native delay engine's arguments of a receiver's queue
    (``core.native_retry``; ``None``: the delay levels hold every retry)."""
    exchanges: list[tuple[str, str, dict[str, Any]]] = [
        (names.work_exchange, "topic", {}),
        (names.orphan_exchange, "fanout", {}),
        (names.deliver_exchange, "headers", {"alternate-exchange": names.orphan_exchange}),
    ]
    ex_bindings: list[tuple[str, str, str]] = []
    dead: str | None = None
    queues: list[QueueSpec] = []
    if queue_type == "quorum":
        dead = names.dead_exchange
        exchanges.append((dead, "fanout", {}))
        queues.append(
            QueueSpec(names.dead_queue, _queue_args(queue_type), [Binding(dead)], parks=True)
        )
    queues.append(
        QueueSpec(
            names.orphan_queue,
            _queue_args(queue_type, dead),
            [Binding(names.orphan_exchange)],
            parks=True,
        )
    )
    for k in range(levels.levels):
        exchanges.append((names.delay_exchange(k), "topic", {}))
        next_hop = names.delay_exchange(k - 1) if k else names.deliver_exchange
        args: dict[str, Any] = {
            "x-message-ttl": levels.ttl_ms(k),
            "x-dead-letter-exchange": next_hop,
        }
        if queue_type == "quorum":
            # at-least-once dead-lettering needs reject-publish overflow (RabbitMQ docs)
            args.update(
                {
                    "x-queue-type": "quorum",
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                }
            )
        queues.append(
            QueueSpec(
                names.delay_queue(k),
                args,
                [Binding(names.delay_exchange(k), levels.binding_key(k, "1"))],
            )
        )
        ex_bindings.append((next_hop, names.delay_exchange(k), levels.binding_key(k, "0")))
    for rec in receivers:
        qname = rec.queue_name(names.prefix)
        if is_ordered(rec):
            _partitioned(rec, qname, names, queue_type, dead, partitions, exchanges, queues)
            ex_bindings.extend(
                (names.partition_exchange(qname), names.work_exchange, rk)
                for rk in rec.routing_keys
            )
            continue
        bindings = [Binding(names.work_exchange, rk) for rk in rec.routing_keys]
        bindings.append(
            Binding(names.deliver_exchange, "", {"x-match": "all", names.target_header: qname})
        )
        args = _queue_args(queue_type, dead)
        max_priority = getattr(rec, "max_priority", 0)
        # A quorum queue takes no x-max-priority (4.0+ has two priorities of its own).
        if max_priority and queue_type != "quorum":
            args["x-max-priority"] = max_priority
        if native_retry is not None and queue_type == "quorum":
            args.update(native_retry(rec))
        queues.append(QueueSpec(qname, args, bindings, receiver=rec.name))
    return Plan(exchanges, ex_bindings, queues)


def _partitioned(
    rec: QueueOwner,
    qname: str,
    names: Names,
    queue_type: str,
    dead: str | None,
    partitions: int,
    exchanges: list[tuple[str, str, dict[str, Any]]],
    queues: list[QueueSpec],
) -> None:
    """An ordered receiver's partition exchange and queues (module doc). Header values are
    strings: a headers exchange compares a value's type as well as its value."""
    exchange = names.partition_exchange(qname)
    header = names.partition_header(qname)
    exchanges.append((exchange, "headers", {}))
    for k in range(partitions):
        pname = names.partition_queue(qname, k)
        args = _queue_args(queue_type, dead)
        # One consumer at a time reads a partition (the others wait as standbys): its keys
        # are seen in queue order whatever the number of consumer processes.
        args["x-single-active-consumer"] = True
        bindings = [
            Binding(exchange, "", {"x-match": "all", header: str(k)}),
            Binding(names.deliver_exchange, "", {"x-match": "all", names.target_header: pname}),
        ]
        queues.append(QueueSpec(pname, args, bindings, receiver=rec.name))


@dataclass(frozen=True)
class Permissions:
    """RabbitMQ permissions (regexes, per vhost) a kind of process needs under a prefix."""

    role: str
    configure: str
    write: str
    read: str
    why: str


def permissions(prefix: str) -> list[Permissions]:
    """What each kind of process needs, least first: every object we own starts with
    ``<prefix>.``, so one regex per permission covers them."""
    ours = "^" + re.escape(prefix) + r"\."
    return [
        Permissions(
            "publisher (web and worker processes that send)",
            "^$",
            ours,
            "^$",
            "publishes to <prefix>.work, and the admin's requeue to <prefix>.deliver",
        ),
        Permissions(
            "consumer (rmq_consume, rmq_relay, rmq_requeue)",
            "^$",
            ours,
            ours,
            "reads its queues, publishes retry copies, binds its queues (exchanges and "
            "queues must exist: rmq_setup declared them)",
        ),
        Permissions(
            "setup (rmq_setup in a deploy pipeline; or a consumer that declares itself)",
            ours,
            ours,
            ours,
            "declares exchanges and queues, binds them",
        ),
    ]
