"""Every exchange, queue and binding we own, computed without touching the broker. Pure.

The shape (prefix ``p``, N delay levels)::

    Topic.send ─► p.work (topic) ──routing key──► p.<receiver>   (one durable queue each)
    retry      ─► p.delay.K (topic) ─bit K=1─► queue p.delay.K (TTL 2^K·res) ─DLX─► p.delay.K-1
                                    ─bit K=0─► exchange p.delay.K-1 ... ─► p.deliver
    p.deliver (headers, match on p-target = queue name) ─► exactly one receiver queue
              └─ alternate exchange p.orphans (fanout) ─► queue p.orphans (parked by consumers)

``broker.topology.declare`` puts a :class:`Plan` on a real broker, ``testing`` into its
in-memory one, and ``rmq_consume --list`` prints it.
"""

from __future__ import annotations

from collections.abc import Iterable
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


@dataclass(frozen=True)
class Plan:
    """Everything to declare."""

    exchanges: list[tuple[str, str, dict[str, Any]]]  # name, type, arguments
    exchange_bindings: list[tuple[str, str, str]]  # destination, source, routing key
    queues: list[QueueSpec]


def _queue_args(queue_type: str) -> dict[str, Any]:
    if queue_type == "quorum":
        return {"x-queue-type": "quorum"}
    return {}


def plan(
    receivers: Iterable[QueueOwner], names: Names, levels: DelayLevels, queue_type: str
) -> Plan:
    exchanges: list[tuple[str, str, dict[str, Any]]] = [
        (names.work_exchange, "topic", {}),
        (names.orphan_exchange, "fanout", {}),
        (names.deliver_exchange, "headers", {"alternate-exchange": names.orphan_exchange}),
    ]
    ex_bindings: list[tuple[str, str, str]] = []
    queues: list[QueueSpec] = [
        QueueSpec(
            names.orphan_queue,
            _queue_args(queue_type),
            [Binding(names.orphan_exchange)],
        )
    ]
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
        bindings = [Binding(names.work_exchange, rk) for rk in rec.routing_keys]
        bindings.append(
            Binding(names.deliver_exchange, "", {"x-match": "all", names.target_header: qname})
        )
        queues.append(QueueSpec(qname, _queue_args(queue_type), bindings, receiver=rec.name))
    return Plan(exchanges, ex_bindings, queues)
