"""What a delivery says about itself, and the properties of what we publish. Pure.

AMQP properties travel here as a plain ``dict`` keyed by the ``BasicProperties`` attribute
names, so this module never sees the AMQP client. Incoming, :func:`read_incoming` reads
everything our headers say about a delivery in one call. Outgoing, three kinds of message
share one base (:func:`_copy`): a fresh one (:func:`build_properties`), the copy published
for a retry (:func:`retry_properties`) and the copy published for a requeue
(:func:`requeue_properties`).
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any

from . import amqptable
from .delays import ms_rounded_up
from .failure import Failure
from .names import Names

#: Every AMQP basic property, by its ``BasicProperties`` attribute name.
PROPERTY_NAMES: tuple[str, ...] = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

#: The properties a caller may set on a fresh message (the rest are ours to set).
CALLER_PROPERTIES = frozenset(
    {
        "message_id",
        "correlation_id",
        "reply_to",
        "priority",
        "type",
        "app_id",
        "timestamp",
        "content_encoding",
        "expiration",
        "user_id",
        "cluster_id",
    }
)

#: Headers owned by the broker; never copied into a message we publish.
BROKER_HEADERS = frozenset({"x-death", "x-delivery-count", "x-acquired-count", "CC", "BCC"})
BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")

#: Stands in for a header table the AMQP client could not decode (see ``broker.headerguard``).
UNDECODABLE_HEADERS = "django-rmq-retry-undecodable-headers"


class UndecodableHeaders(dict[str, Any]):
    """A header table the AMQP client could not decode: ``{UNDECODABLE_HEADERS: reason, ...}``.

    Known by its type, not by the header name: only ``broker.headerguard`` makes one, so a
    publisher that sends a header of that name cannot make its message look undecodable.
    """


class RawHeaders(dict[Any, Any]):
    """Decoded headers that remember the bytes their foreign entries arrived as.

    A client decoding an AMQP table into its own types loses what they cannot say (a
    decimal's exponent, an integer's width and sign, a float's single precision), so a copy
    re-encoded from the values would not be the message the sender wrote. The header guard
    makes one of these for every table it decodes on our connections (``raw``: the table's
    bytes); a copy we make (:func:`_copy`) keeps the entries it does not change, and the
    encoder (``broker.wire``) writes those entries' bytes as they came, then ours.

    Changing a key through any of the dict's methods forgets that key's bytes, so an edited
    value is written as edited.
    """

    __slots__ = ("_entries", "raw")

    def __init__(
        self,
        values: Mapping[Any, Any] = (),  # type: ignore[assignment]
        raw: bytes | None = None,
        entries: Mapping[Any, bytes] | None = None,
    ) -> None:
        super().__init__(values)
        #: The whole table as it arrived (length prefix included), when it did arrive.
        self.raw = raw
        self._entries: dict[Any, bytes] | None = None if entries is None else dict(entries)

    @property
    def entries(self) -> dict[Any, bytes]:
        """Each key whose value is still the one that arrived, and its entry's bytes."""
        if self._entries is None:
            found: dict[Any, bytes] = {}
            if self.raw is not None:
                try:
                    found = amqptable.entries(self.raw)
                except amqptable.BadTable:
                    found = {}
            self._entries = {k: v for k, v in found.items() if k in self}
        return self._entries

    def kept(self, values: Mapping[Any, Any], changed: set[Any]) -> RawHeaders:
        """``values`` (a copy's headers) with this table's bytes for every key they share
        that is not in ``changed``."""
        entries = {k: b for k, b in self.entries.items() if k in values and k not in changed}
        return RawHeaders(values, entries=entries)

    def _forget(self, key: Any) -> None:
        if self._entries is None:
            self.entries  # noqa: B018  (cut the table now, before it changes)
        assert self._entries is not None
        self._entries.pop(key, None)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._forget(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._forget(key)
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._forget(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[Any, Any]:
        key, value = super().popitem()
        self._forget(key)
        return key, value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self._forget(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self) -> None:
        self._entries = {}
        super().clear()

    def copy(self) -> RawHeaders:
        return RawHeaders(self, self.raw, self.entries)

    def __ior__(self, other: Any) -> RawHeaders:  # type: ignore[misc]
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        return (RawHeaders, (dict(self), self.raw, self.entries))


#: The attempt number we accept from a header; anything above is treated as this.
MAX_ATTEMPT = 1_000_000


@dataclass(frozen=True)
class Envelope:
    """What our headers say about one delivery (each value checked, never trusted blindly)."""

    attempt: int  # 1 on the first delivery
    exchange: str  # where the message was first published, even on a retry
    routing_key: str
    requeued: int  # times an operator requeued it (a claim: parking checks it against the row)
    first_failure: datetime | None
    parked_id: str | None  # the parked row a requeued copy says it came from (a claim)
    target: str | None  # the receiver queue a retry or requeue copy is addressed to
    undecodable: str | None  # why the header table could not be read (it was dropped)
    warning: str | None  # a header we ignored, and why
    via_us: bool = False  # it arrived through our delay levels or deliver exchange


#: Headers only our own retry copies may carry: read only from a delivery that came back
#: through our delay levels or deliver exchange (:func:`came_through_us`), ignored elsewhere.
RETRY_HEADERS = ("attempt", "first-failure", "original-exchange", "original-routing-key")
#: The oldest first-failure time we accept, and how far ahead of the clock.
_EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
_CLOCK_SKEW = timedelta(days=1)
#: A parked row id: ASCII digits that fit a signed 64-bit primary key.
_ROW_ID = re.compile(r"[0-9]{1,18}")


def came_through_us(exchange: str, names: Names) -> bool:
    """Whether a delivery arrived on a route only our own copies take.

    Retry copies reach a receiver queue from the deliver exchange, dead-lettered from a
    delay level, or through the orphans exchange; a receiver-mode requeue from the deliver
    exchange. Everything a publisher sends to the work exchange (or any other) is foreign
    input, whatever headers it carries (forwarded from another message, or forged).
    """
    if exchange in (names.deliver_exchange, names.orphan_exchange):
        return True
    prefix = names.delay_exchange_prefix
    tail = exchange[len(prefix) :]
    return exchange.startswith(prefix) and len(tail) == 2 and tail.isdigit() and tail.isascii()


def read_incoming(
    headers: Mapping[str, Any] | None, exchange: str, routing_key: str, names: Names
) -> Envelope:
    """Everything our headers say about a delivery that arrived on ``exchange``/``routing_key``.

    Our headers are input like any other: each is type- and range-checked, and the ones only
    a retry copy carries (attempt, first failure, original route) count only when the
    delivery came through our own route (:func:`came_through_us`). A message published
    straight to the work exchange is always attempt 1 at its own routing key.
    """
    if not headers:  # most deliveries: a first attempt, published by us or without headers
        return _headerless(exchange, routing_key, names)
    h = names.header
    via_us = came_through_us(exchange, names)
    warning = None
    first_failure = None
    if via_us:
        attempt, warning = _attempt(headers, names)
        original = _route(headers, names)
        if original is not None:
            # Copies travelling through the delay levels carry a binary routing key.
            exchange, routing_key = original
        first_failure = valid_first_failure(headers.get(h("first-failure")))
    else:
        attempt = 1
        ignored = [h(k) for k in RETRY_HEADERS if h(k) in headers]
        if ignored:
            warning = (
                f"ignored {', '.join(ignored)}: only our own retry copies carry them, and "
                f"this message was published to {exchange!r}"
            )
    undecodable = (
        headers.get(UNDECODABLE_HEADERS) if isinstance(headers, UndecodableHeaders) else None
    )
    requeued = _int(headers, h("requeued"))
    parked_id = _str(headers, h("parked-id"))
    return Envelope(
        attempt=attempt,
        exchange=exchange,
        routing_key=routing_key,
        requeued=requeued if requeued is not None and 0 <= requeued <= MAX_ATTEMPT else 0,
        first_failure=first_failure,
        parked_id=parked_id if parked_id is not None and _ROW_ID.fullmatch(parked_id) else None,
        target=_short_str(headers, names.target_header),
        undecodable=None if undecodable is None else str(undecodable),
        warning=warning,
        via_us=via_us,
    )


@lru_cache(maxsize=1024)
def _headerless(exchange: str, routing_key: str, names: Names) -> Envelope:
    """The envelope of a delivery without headers: it depends on its route only, so each
    route's is built once (envelopes are immutable; the happy path reads one per message)."""
    return Envelope(
        attempt=1,
        exchange=exchange,
        routing_key=routing_key,
        requeued=0,
        first_failure=None,
        parked_id=None,
        target=None,
        undecodable=None,
        warning=None,
        via_us=came_through_us(exchange, names),
    )


def _attempt(headers: Mapping[str, Any], names: Names) -> tuple[int, str | None]:
    """Attempt number (1-based) and a warning if the header was bad.

    Missing means 1. A header that is not an integer from 1 to ``MAX_ATTEMPT`` (a string,
    a list, a negative or absurd number...) restarts the count at 1 rather than crash, loop,
    or park a message as "failed a million times"; the warning says why.
    """
    name = names.header("attempt")
    raw = headers.get(name)
    if raw is None:
        return 1, None
    if isinstance(raw, bool) or not isinstance(raw, int):
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
        if isinstance(text, str) and text.strip().isascii() and text.strip().isdigit():
            raw = int(text.strip()[:20])
        else:
            return 1, f"ignored malformed {name} header {_short(raw)}"
    if not 1 <= raw <= MAX_ATTEMPT:
        return 1, f"ignored out-of-range {name} header {_short(raw)}"
    return raw, None


def _route(headers: Mapping[str, Any], names: Names) -> tuple[str, str] | None:
    """The original exchange and routing key, if both are valid AMQP short strings."""
    exchange = _short_str(headers, names.header("original-exchange"))
    key = _short_str(headers, names.header("original-routing-key"))
    if exchange is None or key is None:
        return None
    return exchange, key


def _short_str(headers: Mapping[str, Any], name: str) -> str | None:
    """A header that names an exchange, a routing key or a queue: at most 255 bytes."""
    text = _str(headers, name)
    if text is None or len(text.encode("utf-8", "surrogatepass")) > 255:
        return None
    return text


def valid_first_failure(value: Any) -> datetime | None:
    """A first-failure header as an aware UTC time, or ``None`` if it is not a plausible one.

    Only ISO 8601 text with a UTC offset, from 2000 to a day past now: a value at the edge
    of the calendar (year 1 or 9999 with an offset) cannot be converted or stored by every
    database, and must never make parking fail.
    """
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        at = datetime.fromisoformat(value)
        if at.tzinfo is None or at.utcoffset() is None:
            return None
        at = at.astimezone(timezone.utc)
    except (ValueError, OverflowError, TypeError):
        return None
    if not _EARLIEST <= at <= datetime.now(timezone.utc) + _CLOCK_SKEW:
        return None
    return at


def _int(headers: Mapping[str, Any], name: str) -> int | None:
    raw = headers.get(name)
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    if isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit():
        return int(raw.strip()[:20])
    return None


def _str(headers: Mapping[str, Any], name: str) -> str | None:
    raw = headers.get(name)
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return raw if isinstance(raw, str) else None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_broker_header(name: str) -> bool:
    return name in BROKER_HEADERS or name.startswith(BROKER_HEADER_PREFIXES)


def clean_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Caller headers minus the broker-owned ones (``x-death`` & co.)."""
    return {k: v for k, v in (headers or {}).items() if not is_broker_header(str(k))}


def iso(at: datetime) -> str:
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds")


# Outgoing ---------------------------------------------------------------------------------
def build_properties(
    content_type: str,
    headers: Mapping[str, Any] | None,
    properties: Mapping[str, Any],
    names: Names | None = None,
) -> dict[str, Any]:
    """Properties of a fresh message: the caller's, plus persistence, an id and a timestamp.

    With ``names``, the caller's headers lose every reserved one (:func:`fresh_headers`).
    """
    unknown = set(properties) - CALLER_PROPERTIES
    if unknown:
        raise TypeError(f"unknown message properties: {', '.join(sorted(unknown))}")
    props: dict[str, Any] = dict(properties)
    props["content_type"] = content_type
    props["delivery_mode"] = 2
    props["headers"] = fresh_headers(headers, names) if names else dict(headers or {})
    props.setdefault("message_id", uuid.uuid4().hex)
    props.setdefault("timestamp", int(time.time()))
    return props


def fresh_headers(headers: Mapping[str, Any] | None, names: Names) -> dict[str, Any]:
    """A fresh message's headers: the caller's minus ours and the broker's.

    Headers named ``<prefix>-...`` describe one message's story (its attempt, first
    failure, original route, parked row): passed on from a received message (for tracing,
    ``headers=message.headers``) they would make the new message start at a later attempt
    and report another topic's route. Broker-owned ones (``x-death`` & co.) are the
    broker's to write. Both are dropped; every other header is kept as given.
    """
    ours = names.header("")
    return {
        k: v
        for k, v in clean_headers(headers).items()
        if not str(k).startswith(ours) and k != UNDECODABLE_HEADERS
    }


def _copy(properties: Mapping[str, Any], names: Names, ours: Mapping[str, Any]) -> dict[str, Any]:
    """The properties of a copy we publish of a message we received.

    Body and every property are kept except two that would break the delay path:
    ``expiration`` (a per-message TTL would cut the wait short and, on the receiver queue,
    drop the message) and ``user_id`` (the broker refuses a user id that is not ours). Both
    are kept in headers. Broker-owned headers are dropped: our counting never reads them.
    ``ours`` is then written over the headers (a ``None`` value removes that header).
    """
    props = {k: properties.get(k) for k in PROPERTY_NAMES if k != "headers"}
    source = properties.get("headers")
    headers = clean_headers(source)
    h = names.header
    changed = set(ours)
    if props.get("expiration") is not None:
        headers[h("original-expiration")] = props["expiration"]
        changed.add(h("original-expiration"))
    if props.get("user_id") is not None:
        headers[h("original-user-id")] = props["user_id"]
        changed.add(h("original-user-id"))
    props["expiration"] = props["user_id"] = None
    for key, value in ours.items():
        if value is None:
            headers.pop(key, None)
        else:
            headers[key] = value
    # The sender's entries go out as the bytes they came as (their types kept exactly).
    props["headers"] = source.kept(headers, changed) if isinstance(source, RawHeaders) else headers
    props["delivery_mode"] = 2
    return props


def retry_properties(
    properties: Mapping[str, Any],
    *,
    names: Names,
    attempt: int,
    failure: Failure,
    exchange: str,
    routing_key: str,
    target_queue: str,
    due_us: int,
    first_failure: datetime | None = None,
) -> dict[str, Any]:
    """Properties of the copy published for the next attempt.

    ``first_failure`` is the validated time of the first failure (``Envelope.first_failure``),
    never the header's text: a copy carries only values we checked.
    """
    h = names.header
    first = iso(first_failure or failure.at)
    return _copy(
        properties,
        names,
        {
            h("attempt"): attempt,
            h("first-failure"): first,
            h("last-failure"): iso(failure.at),
            h("error-type"): failure.error_type,
            h("error"): failure.error_message,
            h("original-exchange"): exchange,
            h("original-routing-key"): routing_key,
            h("due"): ms_rounded_up(due_us),  # what every version reads
            h("due-us"): due_us,  # the same to the µs (``core.delays.landing_wait``)
            names.target_header: target_queue,
        },
    )


def requeue_properties(
    properties: Mapping[str, Any],
    *,
    names: Names,
    exchange: str,
    routing_key: str,
    target_queue: str | None,
    parked_id: int | str,
    requeue_count: int,
) -> dict[str, Any]:
    """Properties of a parked message sent back to work: attempts reset, history kept."""
    h = names.header
    reset = dict.fromkeys(
        [
            h(key)
            for key in (
                "attempt",
                "due",
                "due-us",
                "first-failure",
                "last-failure",
                "error-type",
                "error",
            )
        ]
    )
    return _copy(
        properties,
        names,
        {
            **reset,
            h("original-exchange"): exchange,
            h("original-routing-key"): routing_key,
            h("requeued"): requeue_count,
            h("parked-id"): str(parked_id),
            names.target_header: target_queue,
        },
    )


def delivery_digest(queue: str, message_id: Any, body: bytes, *extra: str) -> str:
    """A stable identity for one message in one queue: sha256 of queue, id, body and ``extra``.

    The same delivery redelivered gets the same digest, so it finds what an earlier delivery
    stored (the park key, the delivery-limit row). Changing how it is built re-keys rows
    already stored: a redelivery would then park twice.
    """
    parts = [queue, str(message_id or ""), hashlib.sha256(body).hexdigest(), *extra]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
