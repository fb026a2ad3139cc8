"""Writing to the outbox: one INSERT in the sender's transaction, nothing else.

Rows written by one transaction share a *group* token so the relay publishes them in the
order they were written even when several relays share the work. The token lives as long
as the transaction: it is tied to the ``on_commit`` callback registered with the first row,
and a callback Django dropped (rollback of the transaction or of the savepoint it was
registered in) means a new transaction, hence a new token.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from .. import broker
from ..conf import app_settings, current_names
from ..core.envelope import build_properties
from ..core.json_columns import json_safe_headers
from ..models import OutboxMessage
from ..publishing.partitions import partitioner
from ..publishing.publisher import PublishResult, encode_body
from .relay import publish_pending, relay_wakeup, rows_written

logger = logging.getLogger("django_rmq_retry.outbox")

#: Attribute on Django's per-thread connection: (group token, its on_commit callback).
_STATE = "_rmq_retry_outbox"


def enqueue(
    routing_key: str,
    body: Any,
    *,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
    using: str | None = None,
    **properties: Any,
) -> PublishResult:
    """Write ``body`` for ``routing_key`` to the outbox in the current transaction.

    The message id is fixed now, so every publish of this row (a relay that crashed after
    the broker's confirm publishes it again) carries the same id.
    """
    return enqueue_many(
        routing_key,
        [body],
        headers=headers,
        content_type=content_type,
        using=using,
        **properties,
    )[0]


def enqueue_many(
    routing_key: str,
    bodies: Iterable[Any],
    *,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
    using: str | None = None,
    **properties: Any,
) -> list[PublishResult]:
    """:func:`enqueue` for several bodies: one multi-row INSERT. Every body and its
    properties are encoded before anything is written, so a body that is not JSON
    serialisable (or a header AMQP cannot carry) writes nothing and raises here."""
    names = current_names()
    messages = []
    partition = partitioner(routing_key, names.work_exchange, names)
    for body in bodies:
        data, ctype = encode_body(body, content_type)
        props = build_properties(ctype, headers, properties, names)
        if partition is not None:  # per-key order: the partition header, before the row
            partition(data, props)
        messages.append((data, props, _wire(props)))
    if not messages:
        return []
    db = using or router.db_for_write(OutboxMessage)
    in_transaction = connections[db].in_atomic_block
    group = _group(db) if in_transaction else uuid.uuid4().hex
    now = timezone.now()
    OutboxMessage.objects.using(db).bulk_create(
        [
            OutboxMessage(
                group=group,
                exchange=names.work_exchange,
                routing_key=routing_key,
                message_id=str(props.get("message_id") or "")[:255],
                body=data,
                properties=json_safe_headers({k: v for k, v in props.items() if v is not None}),
                wire_properties=wire,
                created_at=now,
                available_at=now,
            )
            for data, props, wire in messages
        ],
        batch_size=1000,
    )
    rows_written.set()
    if not in_transaction:  # autocommit: the rows are committed already
        _committed(db, group)
    return [
        PublishResult(p["message_id"], names.work_exchange, routing_key) for _d, p, _w in messages
    ]


def _wire(properties: Mapping[str, Any]) -> bytes | None:
    """The properties AMQP-encoded for the relay (raising here if AMQP cannot carry them).

    The relay knows an encoded message's id from the row's ``message_id`` column (a returned
    message is matched by it); an id that column cannot hold exactly (not a non-empty text)
    leaves the row to the JSON copy."""
    encoded = broker.encode_properties(properties)
    message_id = properties.get("message_id")
    return encoded if message_id is None or (isinstance(message_id, str) and message_id) else None


def _group(db: str) -> str:
    """The current transaction's group token (see the module docstring)."""
    conn = connections[db]
    state: tuple[str, Callable[[], None]] | None = getattr(conn, _STATE, None)
    if state is not None and any(entry[1] is state[1] for entry in conn.run_on_commit):
        return state[0]
    token = uuid.uuid4().hex
    callback = functools.partial(_committed, db, token)
    transaction.on_commit(callback, using=db)
    setattr(conn, _STATE, (token, callback))
    return token


def _committed(db: str, token: str) -> None:
    """After the commit: wake this process's relay and, by default, publish the rows now."""
    relay_wakeup.set()
    if not app_settings.OUTBOX_PUBLISH_ON_COMMIT:
        return
    try:
        publish_pending(using=db, group=token)
    except Exception as exc:  # the relay publishes them later; the commit stands
        logger.warning(
            "outbox rows of a committed transaction were not published at once (%s); "
            "the relay (rmq_consume or rmq_relay) will publish them",
            exc,
        )
