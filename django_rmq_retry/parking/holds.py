"""Held keys in the database: the transitions of per-key order (``core.ordering``).

One :class:`~..models.KeyHold` row per held key names the message that alone may run for
it; the messages of the key that arrive meanwhile are set aside as
:class:`~..models.HeldMessage` rows, their ``id`` their place. The consumer reading the
key's partition (one at a time: single active consumer) calls these functions from its
ordering gate (``consumer.ordering_gate``); an operator's discard of a parked blocker, and
the parking of a blocker, reach them through signals (:func:`connect`).

Every transition runs in one transaction on the locked hold row. Releasing publishes the
rows set aside again, in ``id`` order, to the key's partition queue (through the deliver
exchange, as a requeue does) and keeps them: a row is deleted only once its copy ran (or
failed and became the blocker), and a copy that comes twice finds its row gone (it ran:
acked). The key's consumer publishes before it commits (:func:`release_next`,
:func:`row_done`); an operator's release commits first and :func:`release_stalled` covers
a publish that never happened.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, router, transaction
from django.utils import timezone

from .. import broker, signals
from ..conf import app_settings, current_names
from ..core.json_columns import headers_from_json, json_safe_headers, properties_json
from ..core.ordering import Hold, HoldState, after_park, message_identity
from ..models import HeldMessage, KeyHold
from ..publishing.per_thread import get_publisher
from ..registry import default_registry

logger = logging.getLogger("django_rmq_retry.ordering")

#: Our header on a released copy: the set-aside row it was published from.
HELD_HEADER = "held"


@dataclass(frozen=True)
class Found:
    """A key's hold as the gate reads it: the pure view, its row id, and whether the row
    a released copy names is still held under it."""

    hold: Hold | None
    pk: int | None
    row_held: bool


def _db() -> str:
    return router.db_for_write(KeyHold)


def _view(row: KeyHold) -> Hold:
    first = (
        HeldMessage.objects.using(_db())
        .filter(hold_id=row.pk)
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    return Hold(row.blocker, HoldState(row.state), first)


def read(receiver: str, key: str, row: int | None) -> Found:
    """The hold of ``key`` (one indexed read when the key is free: the usual case)."""
    hold = KeyHold.objects.using(_db()).filter(receiver=receiver, key=key).first()
    if hold is None:
        held = row is not None and HeldMessage.objects.using(_db()).filter(pk=row).exists()
        return Found(None, None, held)
    held = row is not None and HeldMessage.objects.using(_db()).filter(pk=row, hold=hold).exists()
    return Found(_view(hold), hold.pk, held)


def held_keys(receiver: str, queue: str) -> set[str]:
    """The keys of ``receiver`` held on partition ``queue`` now."""
    rows = KeyHold.objects.using(_db()).filter(receiver=receiver, queue=queue)
    return set(rows.values_list("key", flat=True))


def set_aside(
    hold_pk: int,
    *,
    body: bytes,
    properties: Mapping[str, Any],
    exchange: str,
    routing_key: str,
) -> int:
    """Write a message behind the others of its key; its row id is its place."""
    props = {k: v for k, v in properties.items() if k != "headers"}
    row = HeldMessage.objects.using(_db()).create(
        hold_id=hold_pk,
        message_id=str(properties.get("message_id") or "")[:255],
        exchange=exchange[:255],
        routing_key=routing_key[:255],
        body=body,
        properties=properties_json(props),
        headers=json_safe_headers(properties.get("headers") or {}),
        held_at=timezone.now(),
    )
    return int(row.pk)


def keep(hold_pk: int, row: int) -> None:
    """A released copy came ahead of its turn (after a redelivery reordered them) and was
    acked: its row stays where it is, and the round ends before it, so the copies of the
    rows before it run and then it is published again with the rest, in order."""
    KeyHold.objects.using(_db()).filter(
        pk=hold_pk, state=HoldState.RELEASING.value, released_upto__gte=row
    ).update(released_upto=row - 1, changed_at=timezone.now())


def take(receiver: str, key: str, queue: str, blocker: str) -> None:
    """A message of a free key failed: the key is held behind it (its retry, or its
    parking, follows). A hold already there (a redelivery) is left as it is: one INSERT,
    and its unique constraint says whether it was there."""
    now = timezone.now()
    try:
        with transaction.atomic(using=_db()):
            KeyHold.objects.using(_db()).create(
                receiver=receiver,
                key=key,
                queue=queue,
                state=HoldState.RETRYING.value,
                blocker=blocker,
                since=now,
                changed_at=now,
            )
    except IntegrityError:
        pass


def block_on_row(hold_pk: int, row: int, blocker: str) -> None:
    """A released copy failed: it is the blocker now (its retry copy carries it on) and
    its row goes; the copies behind it will wait again, each keeping its row."""
    with transaction.atomic(using=_db()):
        KeyHold.objects.using(_db()).filter(pk=hold_pk).update(  # the hold first: _lock
            state=HoldState.RETRYING.value,
            blocker=blocker,
            parked_id=None,
            released_upto=None,
            changed_at=timezone.now(),
        )
        HeldMessage.objects.using(_db()).filter(pk=row, hold_id=hold_pk).delete()


def row_done(hold_pk: int, row: int) -> None:
    """A released copy ran: its row goes. If it was the last copy of its round, the rows
    set aside since are published first (in order), then the row goes and they become
    the round, in one transaction (or, with none, the key is free). Called by the key's
    consumer before it acks the copy (see :func:`release_next` for why this order)."""
    hold = KeyHold.objects.using(_db()).filter(pk=hold_pk).first()
    held = HeldMessage.objects.using(_db()).filter(hold_id=hold_pk)
    if hold is None or hold.state != HoldState.RELEASING.value:
        held.filter(pk=row).delete()
        return
    upto = hold.released_upto or 0
    if held.filter(pk__lte=upto).exclude(pk=row).exists():  # copies of this round are out
        held.filter(pk=row).delete()
        return
    following = list(held.filter(pk__gt=upto).order_by("id"))
    if following:
        _publish(hold.queue, following)
    with transaction.atomic(using=_db()):
        _lock(hold_pk)
        held.filter(pk=row).delete()
        if following:
            KeyHold.objects.using(_db()).filter(pk=hold_pk).update(released_upto=following[-1].pk)
        elif not held.exists():
            KeyHold.objects.using(_db()).filter(pk=hold_pk).delete()


def release_next(hold_pk: int) -> int:
    """The blocker succeeded: publish the rows set aside, in order, to the key's partition
    queue, then mark the key releasing (with none, the key is free). Returns the number of
    copies published.

    Called by the consumer of the key's partition before it acks the blocker, publishing
    *first*: the copies cannot run before the commit (this thread is the partition's only
    consumer), and a crash between the publish and the commit gives the blocker back first
    (it runs again and publishes again; the first copies then find their rows gone). A
    publish that fails raises: the blocker is given back and tries again. Nothing waits for
    a sweep."""
    hold = KeyHold.objects.using(_db()).filter(pk=hold_pk).first()
    if hold is None:
        return 0
    rows = list(HeldMessage.objects.using(_db()).filter(hold_id=hold_pk).order_by("id"))
    if rows:
        _publish(hold.queue, rows)
    with transaction.atomic(using=_db()):
        _lock(hold_pk)
        if rows:
            KeyHold.objects.using(_db()).filter(pk=hold_pk).update(
                state=HoldState.RELEASING.value, parked_id=None, released_upto=rows[-1].pk
            )
        elif not HeldMessage.objects.using(_db()).filter(hold_id=hold_pk).exists():
            KeyHold.objects.using(_db()).filter(pk=hold_pk).delete()
    return len(rows)


def release(hold_pk: int) -> int:
    """An operator (or the parking of a blocker with ``"skip"``) releases a key from
    outside its consumer: mark it releasing, then publish its rows in order (with none, the
    key is free). Committed first: the key's consumer may run a copy as soon as it
    arrives. If the publish fails after the commit, :func:`release_stalled` publishes the
    rows again later. Returns the number of copies published."""
    with transaction.atomic(using=_db()):
        if not _lock(hold_pk):
            return 0
        hold = KeyHold.objects.using(_db()).get(pk=hold_pk)
        rows = list(HeldMessage.objects.using(_db()).filter(hold_id=hold_pk).order_by("id"))
        if not rows:
            hold.delete()
            return 0
        KeyHold.objects.using(_db()).filter(pk=hold_pk).update(
            state=HoldState.RELEASING.value,
            parked_id=None,
            released_upto=rows[-1].pk,
            changed_at=timezone.now(),
        )
        queue = hold.queue
    _publish(queue, rows)
    return len(rows)


def _lock(hold_pk: int) -> bool:
    """Inside a transaction: lock the hold row by writing it first (its ``changed_at``),
    whether it still exists. Writing first, not reading, matters on SQLite: a transaction
    that reads and then writes fails at once with "database is locked" when another
    process writes meanwhile, where one that writes first waits its turn."""
    return bool(KeyHold.objects.using(_db()).filter(pk=hold_pk).update(changed_at=timezone.now()))


def _publish(queue: str, rows: Iterable[HeldMessage]) -> None:
    """Publish copies of ``rows`` to ``queue``, in order, confirmed by the broker."""
    names = current_names()
    items = []
    for row in rows:
        props = headers_from_json(row.properties)
        headers = headers_from_json(row.headers)
        headers[names.target_header] = queue
        headers[names.header(HELD_HEADER)] = int(row.pk)
        props["headers"] = headers
        items.append(broker.Outgoing(names.deliver_exchange, "", bytes(row.body), props))
    get_publisher().send_items(items)


def release_stalled(older_than: float) -> int:
    """Holds releasing with no progress for ``older_than`` seconds (an operator's release
    whose copies were never published: its process died between the commit and the
    publish): publish their rows again. A copy that comes twice finds its row gone and is
    acked. Returns how many holds were released again."""
    cutoff = timezone.now() - timedelta(seconds=older_than)
    stalled = list(
        KeyHold.objects.using(_db())
        .filter(state=HoldState.RELEASING.value, changed_at__lt=cutoff)
        .values_list("pk", flat=True)[:100]
    )
    for pk in stalled:
        release(pk)
    return len(stalled)


# Signals: a blocker parked, a parked blocker discarded -------------------------------------
def blocker_parked(receiver: str, blocker: str, parked_id: int) -> None:
    """A message of an ordered receiver was parked: if it holds its key, the key stays
    held until an operator decides (``ORDERING_ON_PARK = "hold"``) or the messages behind
    it go on (``"skip"``)."""
    hold = KeyHold.objects.using(_db()).filter(receiver=receiver, blocker=blocker).first()
    if hold is None:
        return
    step = after_park(_view(hold), blocker, str(app_settings.ORDERING_ON_PARK))
    if step.value == "hold_parked":
        KeyHold.objects.using(_db()).filter(pk=hold.pk, blocker=blocker).update(
            state=HoldState.PARKED.value, parked_id=parked_id, changed_at=timezone.now()
        )
    elif step.value == "release":
        release(hold.pk)


def discarded(parked_ids: Iterable[int]) -> int:
    """Parked rows were discarded: the keys they held go on (their messages are released
    in order). Returns the number of keys released."""
    ids = list(parked_ids)
    holds = list(
        KeyHold.objects.using(_db())
        .filter(parked_id__in=ids, state=HoldState.PARKED.value)
        .values_list("pk", flat=True)
    )
    for pk in holds:
        release(pk)
    return len(holds)


def _on_parked(sender: Any, parked: Any = None, **kwargs: Any) -> None:
    rec = default_registry.get(str(sender))
    if rec is None or rec.ordering_key is None or parked is None:
        return  # (every park of every receiver passes here: nothing read for the others)
    blocker = message_identity(parked.message_id, parked.routing_key, bytes(parked.body))
    try:
        blocker_parked(rec.name, blocker, int(parked.pk))
    except Exception:  # a signal receiver must not raise; the hold's way out is the admin
        logger.exception("could not record the parking of %s in its key's hold", blocker)


def _on_discarded(sender: Any, parked_ids: Any = (), **kwargs: Any) -> None:
    try:
        discarded(parked_ids or ())
    except Exception:
        logger.exception("could not release the keys held by discarded rows %s", parked_ids)


def connect() -> None:
    """Listen for parked and discarded rows (idempotent: ``dispatch_uid``)."""
    signals.message_parked.connect(_on_parked, dispatch_uid="django_rmq_retry.ordering.parked")
    signals.message_discarded.connect(
        _on_discarded, dispatch_uid="django_rmq_retry.ordering.discarded"
    )


connect()  # whoever parks or discards imports the parking package, and with it this module
