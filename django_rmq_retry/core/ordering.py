"""Per-key order: which partition a key goes to, and when a key is held. Pure.

An ordered receiver (``@receiver(topic, ordering_key=...)``) reads N partition queues, each
with a single active consumer; the publisher sends every message of one key to the same
partition (:func:`partition_of`), so one consumer at a time sees that key's messages in
publish order. A retry would break that order (its copy comes back behind later messages of
the key), so a failed message *holds its key*: until it succeeds or is parked, later messages
of the same key are set aside in the database, in arrival order, while other keys of the
partition go on. The rules of that hold are the functions below; the consumer applies them
(``consumer.ordering_gate``) and the database keeps the hold (``parking.holds``).

The hash must give the same partition in every process, on every Python version and
machine, for as long as messages wait in a queue: Python's ``hash()`` of a ``str`` is salted
per process, so a CRC-32 of the key's UTF-8 bytes is used instead (``zlib``, a fixed
polynomial). Changing ``ORDERING_PARTITIONS`` moves keys to other partitions: messages
already queued under the old count keep their place, so change it only with drained queues.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: Longest ordering key kept (a key is a column of the hold and a header value).
KEY_MAX = 200

#: What ``ORDERING_ON_PARK`` may say.
ON_PARK_CHOICES = ("hold", "skip")


class OrderingKeyError(ValueError):
    """A message's ordering key cannot be read: the body lacks the field, or it is empty or
    too long. The sender hears it at ``send``; a consumer parks such a message."""


def partition_of(key: str, partitions: int) -> int:
    """The partition (``0 .. partitions - 1``) of ``key``: stable everywhere (module doc)."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def key_from_body(body: Any, field: str) -> str:
    """The ordering key of a decoded body: the value of ``field`` (``a.b`` for a nested
    field) as text. Numbers are keys too (``42`` and ``"42"`` are one key)."""
    value: Any = body
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise OrderingKeyError(f"the body has no field {field!r} to order by")
        value = value[part]
    return check_key(value, f"field {field!r}")


def check_key(value: Any, where: str) -> str:
    """``value`` as an ordering key, or :class:`OrderingKeyError` saying what is wrong."""
    if isinstance(value, bool) or value is None:
        raise OrderingKeyError(f"the ordering key ({where}) is {value!r}, not a key")
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        raise OrderingKeyError(
            f"the ordering key ({where}) must be text or a number, got {type(value).__name__}"
        )
    if not value:
        raise OrderingKeyError(f"the ordering key ({where}) is empty")
    if len(value) > KEY_MAX:
        raise OrderingKeyError(f"the ordering key ({where}) is longer than {KEY_MAX} characters")
    return value


def message_identity(message_id: object, routing_key: str, body: bytes) -> str:
    """Which message a hold waits for: its message id, or without one (or one too long for
    the column) a digest of its routing key and body. A retry copy and a requeued copy keep
    both, so they are the same message as the one that failed."""
    if isinstance(message_id, str) and message_id and len(message_id) <= 200:
        return message_id
    digest = hashlib.sha256(routing_key.encode("utf-8", "surrogatepass") + b"\0" + body)
    return "sha256:" + digest.hexdigest()


# The hold --------------------------------------------------------------------------------
class HoldState(str, Enum):
    """Why a key is held (one row per held key in the database)."""

    #: Its blocker failed and waits for its retry copy (or runs it).
    RETRYING = "retrying"
    #: Its blocker was parked (``ORDERING_ON_PARK = "hold"``): an operator decides.
    PARKED = "parked"
    #: The messages set aside were published again, in order, and run one by one.
    RELEASING = "releasing"


@dataclass(frozen=True)
class Hold:
    """A held key as the consumer reads it.

    ``blocker`` is the message (by its message id: ``consumer.inbox.message_key``) that
    alone may run for this key while it is retrying or parked. ``first_row`` is the lowest
    set-aside row still held: while releasing, only its copy may run.
    """

    blocker: str
    state: HoldState
    first_row: int | None = None


@dataclass(frozen=True)
class Incoming:
    """A message of an ordered receiver as it arrives (or as it ran).

    ``row`` is the set-aside row a released copy came from (our ``held`` header), and
    ``row_held`` whether that row is still held: a copy whose row is gone ran before.
    """

    message: str
    row: int | None = None
    row_held: bool = False


class Arrival(str, Enum):
    """What to do with a message of an ordered receiver as it arrives."""

    RUN = "run"  # the key is free, or this message is the one it waits for
    SET_ASIDE = "set_aside"  # write it behind the others of its key (a new row), then ack
    KEEP = "keep"  # a released copy that must wait again: its row stays where it is; ack
    DUPLICATE = "duplicate"  # it ran before (its row or its hold is gone): ack, do not run


def on_arrival(hold: Hold | None, incoming: Incoming) -> Arrival:
    """Whether a message runs now (module doc). Set-aside rows keep their place: a copy
    released from one that must wait again keeps its row, so nothing behind it overtakes."""
    blocking = hold is not None and hold.state is not HoldState.RELEASING
    if blocking and hold is not None and incoming.message == hold.blocker:
        # its retry copy (which keeps a released copy's row header: that row went when
        # the copy became the blocker)
        return Arrival.RUN
    if incoming.row is not None and not incoming.row_held:
        return Arrival.DUPLICATE
    if hold is None:
        return Arrival.RUN
    if hold.state is HoldState.RELEASING:
        if incoming.row is not None:
            return Arrival.RUN if incoming.row == hold.first_row else Arrival.KEEP
        if incoming.message == hold.blocker:  # the old blocker again: it ran (or parked)
            return Arrival.DUPLICATE
        return Arrival.SET_ASIDE
    return Arrival.KEEP if incoming.row is not None else Arrival.SET_ASIDE


class Step(str, Enum):
    """What the hold does after an attempt (:func:`after_attempt`, :func:`after_park`)."""

    NOTHING = "nothing"  # the key stays as it was
    HOLD = "hold"  # hold the free key with this message as the blocker (retrying)
    BLOCK = "block"  # a released copy failed: its row goes, it becomes the blocker
    ROW_DONE = "row_done"  # a released copy ran: its row goes; release more if none is out
    RELEASE = "release"  # publish the rows set aside again, in order (or free the key)
    HOLD_PARKED = "hold_parked"  # the blocker was parked: hold until an operator decides


def after_attempt(hold: Hold | None, incoming: Incoming, failed: bool) -> Step:
    """The hold's next step once a message that ran (:func:`on_arrival` said so) ended.
    A failure takes the key (its retry copy, or its parking, follows); a success of the
    blocker releases the messages behind it."""
    released = hold is not None and hold.state is HoldState.RELEASING and incoming.row
    if failed:
        if hold is None:
            return Step.HOLD
        return Step.BLOCK if released else Step.NOTHING
    if released:
        return Step.ROW_DONE
    if hold is not None and hold.blocker == incoming.message:
        return Step.RELEASE
    return Step.NOTHING


def after_park(hold: Hold | None, message: str, on_park: str) -> Step:
    """A message of the key was parked: if it is the blocker, ``on_park``
    (``ORDERING_ON_PARK``) says whether the key stays held until an operator requeues or
    discards it (``"hold"``) or the messages behind it go on (``"skip"``)."""
    if on_park not in ON_PARK_CHOICES:
        raise ValueError(f"on_park must be one of {ON_PARK_CHOICES}, got {on_park!r}")
    if hold is None or hold.blocker != message or hold.state is HoldState.RELEASING:
        return Step.NOTHING
    return Step.HOLD_PARKED if on_park == "hold" else Step.RELEASE


def held_reason(blocker_id: str, key: str, state: HoldState) -> str:
    """Why messages of a key are held, as an operator reads it: which message they wait
    behind, for which key, and why."""
    why = {
        HoldState.RETRYING: "waits for its retry",
        HoldState.PARKED: "is parked (requeue or discard it to release them)",
        HoldState.RELEASING: "ran; the messages behind it are being released in order",
    }[state]
    return f"held behind message {blocker_id} of key {key!r}, which {why}"
