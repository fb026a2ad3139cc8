"""Declare a topology plan (``core.topology_plan.plan``) on a channel. Idempotent: safe on every
start. A queue or exchange that exists with other arguments is named in the error.

Least privilege: declaring an exchange or a queue needs RabbitMQ's *configure* permission,
even when it exists already. A consumer whose user has only read and write (the topology
declared beforehand by ``manage.py rmq_setup`` as a configure user) gets ``ACCESS_REFUSED``;
then every exchange and queue is checked passively instead (it must exist) and the bindings
are made (they need write and read only). A missing one is named with what to run.
Declares run on a channel of their own, so a refusal never closes the caller's channel."""

from __future__ import annotations

import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel
from pika.exchange_type import ExchangeType

from ..core.errors import ConnectionLost, TopologyError
from ..core.topology_plan import Plan


def declare(channel: BlockingChannel, the_plan: Plan) -> None:
    """Declare ``the_plan`` on ``channel``'s connection; a mismatch raises
    :class:`TopologyError`. Without configure permission, check it exists (module doc)."""
    try:
        _on_own_channel(channel, the_plan, passive=False)
    except _Refused:
        _on_own_channel(channel, the_plan, passive=True)


class _Refused(Exception):
    """The user may not configure (declare) our objects."""


def _on_own_channel(channel: BlockingChannel, the_plan: Plan, *, passive: bool) -> None:
    own = channel.connection.channel()
    try:
        _declare(own, the_plan, passive=passive)
    finally:
        if own.is_open:
            own.close()


def _declare(channel: BlockingChannel, the_plan: Plan, *, passive: bool) -> None:
    current = ""
    try:
        for name, kind, args in the_plan.exchanges:
            current = f"exchange {name!r}"
            channel.exchange_declare(
                name, ExchangeType(kind), passive=passive, durable=True, arguments=args or None
            )
        for q in the_plan.queues:
            current = f"queue {q.name!r}"
            channel.queue_declare(
                q.name, passive=passive, durable=True, arguments=q.arguments or None
            )
        for destination, source, key in the_plan.exchange_bindings:
            current = f"binding {source!r} → {destination!r}"
            channel.exchange_bind(destination, source, routing_key=key)
        for q in the_plan.queues:
            for b in q.bindings:
                current = f"binding {b.source!r} → {q.name!r}"
                channel.queue_bind(
                    q.name, b.source, routing_key=b.routing_key, arguments=b.arguments
                )
    except pex.ChannelClosedByBroker as exc:
        if exc.reply_code == 403 and not passive and not current.startswith("binding"):
            raise _Refused from exc
        if exc.reply_code == 406:
            raise TopologyError(
                f"{current} already exists with different arguments: {exc.reply_text}. "
                + _what_to_do(exc.reply_text)
            ) from exc
        if exc.reply_code == 404 and passive:
            raise TopologyError(
                f"{current} does not exist and this user may not declare it (no configure "
                "permission): run 'manage.py rmq_setup' as a user that may "
                "(docs/howto/permissions.md)."
            ) from exc
        if exc.reply_code in UNAVAILABLE:
            raise ConnectionLost(
                f"declaring {current} failed: {exc.reply_code} {exc.reply_text} (a node on "
                "the minority side of a partition cannot change the topology; retried)"
            ) from exc
        raise TopologyError(
            f"declaring {current} failed: {exc.reply_code} {exc.reply_text}"
        ) from exc


#: Reply codes of a declare that may pass later, on this node or another: 541
#: ``INTERNAL_ERROR``, what RabbitMQ 4.2+ (Khepri) answers on the minority side of a
#: partition once the metadata store timed out. The caller reconnects with its backoff
#: (``ConnectionLost``) instead of stopping as for a conflict (``TopologyError``).
UNAVAILABLE = frozenset({541})


#: Arguments a quorum queue declared before we set its delivery limit lacks.
_LIMIT_ARGS = ("x-delivery-limit", "x-dead-letter-exchange", "x-dead-letter-strategy", "x-overflow")


def _what_to_do(reply_text: str) -> str:
    """The operator's next step for a 406 (inequivalent arguments)."""
    if any(f"'{arg}'" in reply_text for arg in _LIMIT_ARGS) and "current is none" in reply_text:
        return (
            "This quorum queue was declared by an older django-rmq-retry without an explicit "
            "delivery limit and dead-letter exchange: on RabbitMQ 4.0+ it drops a message "
            "returned 20 times (warm restarts with it prefetched count). RabbitMQ cannot change "
            "a queue's arguments in place: stop publishers and consumers of it, let a consumer "
            "of the old version drain it (or move its messages with a shovel), delete it, then "
            "run 'manage.py rmq_consume --setup-only' with this version to declare it again."
        )
    return "Delete it (it will be declared again) or make the settings match."


def queue_state(channel: BlockingChannel, name: str) -> tuple[int, int] | None:
    """``(messages, consumers)`` of queue ``name``, or None if it does not exist (a passive
    declare on a channel of its own: read permission is enough, nothing is created)."""
    own = channel.connection.channel()
    try:
        ok = own.queue_declare(name, passive=True)
    except pex.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return None
        raise
    finally:
        if own.is_open:
            own.close()
    return int(ok.method.message_count or 0), int(ok.method.consumer_count or 0)


def delete_queue(channel: BlockingChannel, name: str, *, if_empty: bool) -> bool:
    """Delete queue ``name`` (with ``if_empty``, only while it holds no message): True if it
    was deleted, False if it was not empty. Needs configure permission on it."""
    own = channel.connection.channel()
    try:
        own.queue_delete(name, if_empty=if_empty)
    except pex.ChannelClosedByBroker as exc:
        if exc.reply_code == 406 and if_empty:
            return False
        raise TopologyError(f"deleting queue {name!r} failed: {exc.reply_text}") from exc
    finally:
        if own.is_open:
            own.close()
    return True
