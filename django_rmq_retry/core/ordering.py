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


# The hold --------------------------------------------------------------------------------
class HoldState(str, Enum):
    """Why a key is held (one row per held key in the database)."""

    #: Its blocker failed and waits for its retry copy (or runs it).
    RETRYING = "retrying"
    #: Its blocker was parked (``ORDERING_ON_PARK = "hold"``): an operator decides.
    PARKED = "parked"


@dataclass(frozen=True)
class Hold:
    """A held key as the gate reads it: the message (by :func:`consumer.inbox.message_key`)
    that alone may run for this key now, and why the key is held."""

    blocker: str
    state: HoldState


class Arrival(str, Enum):
    """What to do with a message of an ordered receiver as it arrives."""

    RUN = "run"  # the key is free, or this message is the one the hold waits for
    SET_ASIDE = "set_aside"  # the key is held by another message: keep it behind, in order


def on_arrival(hold: Hold | None, message: str) -> Arrival:
    """A message of a key arrives: it runs if the key is free or if it is the blocker (its
    retry copy, or the held message released to run next); otherwise it waits behind."""
    if hold is None or hold.blocker == message:
        return Arrival.RUN
    return Arrival.SET_ASIDE


class Outcome(str, Enum):
    """How the receiver's attempt ended, as the hold cares."""

    HANDLED = "handled"
    RETRY = "retry"  # a retry copy was published
    PARKED = "parked"


class Step(str, Enum):
    """What the hold does after an attempt (:func:`after_attempt`)."""

    NOTHING = "nothing"  # the key stays as it was (free, or held by this retrying message)
    HOLD = "hold"  # hold the key with this message as the blocker (state retrying)
    HOLD_PARKED = "hold_parked"  # hold the key behind this parked message
    RELEASE = "release"  # let the next message set aside run (or free the key)


def after_attempt(hold: Hold | None, message: str, outcome: Outcome, on_park: str) -> Step:
    """The hold's next step once ``message`` (which ran: :func:`on_arrival` said so) ended
    with ``outcome``. ``on_park`` is ``ORDERING_ON_PARK``: ``"hold"`` keeps the key held
    behind a parked message until an operator requeues or discards it, ``"skip"`` lets the
    messages behind it go on."""
    if on_park not in ON_PARK_CHOICES:
        raise ValueError(f"on_park must be one of {ON_PARK_CHOICES}, got {on_park!r}")
    mine = hold is not None and hold.blocker == message
    if outcome is Outcome.RETRY:
        # A first failure takes the key; a blocker's further retries keep it.
        return Step.NOTHING if mine else Step.HOLD
    if outcome is Outcome.PARKED:
        if on_park == "hold":
            return Step.HOLD_PARKED
        return Step.RELEASE if mine else Step.NOTHING
    return Step.RELEASE if mine else Step.NOTHING


def held_reason(blocker_id: str, key: str, state: HoldState) -> str:
    """The reason a message set aside carries (its parked row's detail): which message it
    waits behind, for which key, and why."""
    why = "waits for its retry" if state is HoldState.RETRYING else "is parked"
    return f"held behind message {blocker_id} of key {key!r}, which {why}"
