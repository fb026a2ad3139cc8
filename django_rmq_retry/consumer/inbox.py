"""Idempotent receivers: the receiver's effects and a "handled" row commit together.

``@receiver(topic, idempotent=True)`` runs the receiver inside a database transaction that
first inserts an :class:`~.models.InboxEntry` keyed on (receiver, message key). A message
redelivered after its transaction committed (the consumer died before the ack, the sender
published it twice) finds the row and is acked without running the receiver again; one whose
transaction rolled back (the receiver raised, the process died) runs again as usual.
The insert comes first so that a concurrent copy waits for the first one's commit (on
PostgreSQL, on the unique index) instead of running beside it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, router, transaction
from django.utils import timezone

from ..conf import app_settings
from ..db.batches import delete_in_batches
from ..models import InboxEntry

KEY_MAX = 255


class _AlreadyHandled(Exception):
    pass


def message_key(message_id: object, routing_key: str, body: bytes) -> str:
    """The message id; without one, ``sha256:`` of routing key and body (so two different
    messages without ids but with the same body and key count as one)."""
    if isinstance(message_id, str) and message_id and len(message_id) <= KEY_MAX:
        return message_id
    digest = hashlib.sha256(routing_key.encode("utf-8", "surrogatepass") + b"\0" + body)
    return "sha256:" + digest.hexdigest()


def run_once(receiver: str, key: str, run: Callable[[], object], using: str | None = None) -> bool:
    """Run ``run`` in a transaction with the (receiver, key) row; ``False`` if that row was
    committed before (``run`` not called). What ``run`` raises rolls both back and propagates."""
    db = using or router.db_for_write(InboxEntry)
    try:
        with transaction.atomic(using=db):
            try:
                InboxEntry.objects.using(db).create(
                    receiver=receiver[:255], key=key, handled_at=timezone.now()
                )
            except IntegrityError:
                raise _AlreadyHandled from None
            run()
    except _AlreadyHandled:
        return False
    return True


def purge_handled(
    older_than: timedelta | None = None,
    *,
    using: str | None = None,
    batch_size: int | None = None,
    dry_run: bool = False,
) -> int:
    """Delete handled-message rows older than ``older_than`` (default INBOX_RETENTION_DAYS),
    in batches so no long lock is held. Returns how many (would be) deleted."""
    if older_than is None:
        older_than = timedelta(days=float(app_settings.INBOX_RETENTION_DAYS))
    db = using or router.db_for_write(InboxEntry)
    batch_size = batch_size or int(app_settings.BATCH_SIZE)
    old = InboxEntry.objects.using(db).filter(handled_at__lt=timezone.now() - older_than)
    return old.count() if dry_run else delete_in_batches(old, batch_size)
