"""Declare every exchange, queue and binding we own. Idempotent; safe on every start.

The shape (prefix ``p``, N delay levels)::

    Topic.send ─► p.work (topic) ──routing key──► p.<receiver>   (one durable queue each)
    retry      ─► p.delay.K (topic) ─bit K=1─► queue p.delay.K (TTL 2^K·res) ─DLX─► p.delay.K-1
                                    ─bit K=0─► exchange p.delay.K-1 ... ─► p.deliver
    p.deliver (headers, match on p-target = queue name) ─► exactly one receiver queue
              └─ alternate exchange p.orphans (fanout) ─► queue p.orphans (parked by consumers)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel
from pika.exchange_type import ExchangeType

from .conf import app_settings
from .delays import DelayLevels
from .errors import TopologyError
from .names import Names
from .topics import Receiver


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
    """Everything to declare, computed without touching the broker (also used by --list)."""

    exchanges: list[tuple[str, str, dict[str, Any]]]
    exchange_bindings: list[tuple[str, str, str]]  # destination, source, routing key
    queues: list[QueueSpec]


def current_names() -> Names:
    return Names(app_settings.PREFIX)


def current_levels() -> DelayLevels:
    return DelayLevels(int(app_settings.DELAY_RESOLUTION_MS), int(app_settings.DELAY_LEVELS))


def _queue_args(queue_type: str) -> dict[str, Any]:
    if queue_type == "quorum":
        return {"x-queue-type": "quorum"}
    return {}


def plan(
    receivers: Iterable[Receiver],
    names: Names | None = None,
    levels: DelayLevels | None = None,
    queue_type: str | None = None,
) -> Plan:
    names = names or current_names()
    levels = levels or current_levels()
    queue_type = queue_type or app_settings.QUEUE_TYPE
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


def declare(channel: BlockingChannel, the_plan: Plan) -> None:
    """Declare ``the_plan`` on ``channel``; a mismatch raises :class:`TopologyError`.

    A failed declare closes the channel (AMQP rules), so the caller must drop it.
    """
    current = ""
    try:
        for name, kind, args in the_plan.exchanges:
            current = f"exchange {name!r}"
            channel.exchange_declare(name, ExchangeType(kind), durable=True, arguments=args or None)
        for destination, source, key in the_plan.exchange_bindings:
            current = f"binding {source!r} → {destination!r}"
            channel.exchange_bind(destination, source, routing_key=key)
        for q in the_plan.queues:
            current = f"queue {q.name!r}"
            channel.queue_declare(q.name, durable=True, arguments=q.arguments or None)
            for b in q.bindings:
                channel.queue_bind(
                    q.name, b.source, routing_key=b.routing_key, arguments=b.arguments
                )
    except pex.ChannelClosedByBroker as exc:
        if exc.reply_code == 406:
            raise TopologyError(
                f"{current} already exists with different arguments: {exc.reply_text}. "
                "Delete it (it will be declared again) or make the settings match."
            ) from exc
        raise TopologyError(
            f"declaring {current} failed: {exc.reply_code} {exc.reply_text}"
        ) from exc
