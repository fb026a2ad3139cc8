"""Publishing with many confirms in flight: one confirm tracker for retry copies, batches
(``Topic.send_many``) and requeues.

``BlockingChannel.basic_publish`` waits for each confirm before returning: one round trip per
message. :class:`ConfirmChannel` puts pika's underlying channel in confirm mode with our own
callbacks, so ``publish`` returns at once and ``on_settled(acked, returned)`` runs inside the
connection's I/O loop once the broker answered. :class:`Pipeline` drives a batch through one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from ..conf import app_settings
from ..core.errors import ConnectionLost, MessageRefused
from ..core.header_budget import properties_room
from .connection import Connection
from .pikaext import FrameWriter, async_channel
from .translate import LOST, describe, refusal
from .wire import Encoded, decode_properties, encode_properties

logger = logging.getLogger("django_rmq_retry.broker")

#: Seconds without any confirm after which a batch gives up (the messages count as failed).
STALL_TIMEOUT = 30.0
#: Messages of a batch written between two runs of the I/O loop (which sends them).
FLUSH_EVERY = 100
#: Seconds the I/O loop runs when a lazy source has nothing to publish yet.
IDLE_PUMP = 0.002
#: The ``user_id`` bit of the properties' flag word.
_USER_ID_FLAG = 1 << 4


def login_of(url: str) -> str | None:
    """The user a connection to ``url`` logs in as (pika's default: guest); ``None`` when
    the URL says nothing we can read (no URL at all)."""
    if not url:
        return None
    try:
        user = urlsplit(url).username
    except ValueError:
        return None
    return unquote(user) if user else "guest"


def early_refusal(
    body: bytes, wire: Encoded, *, login: str | None, frame_max: int, max_message_size: int
) -> str:
    """Why the broker would refuse this message for what it carries ("" when nothing
    says so beforehand): refused here, with a clear reason, it never costs the channel (or
    the connection) and the messages in flight beside it."""
    data = wire.data
    if login is not None and len(data) >= 2 and (data[0] << 8 | data[1]) & _USER_ID_FLAG:
        user_id = decode_properties(data).get("user_id")
        if isinstance(user_id, bytes):
            user_id = user_id.decode("utf-8", "replace")
        if user_id != login:
            return (
                f"its user_id {user_id!r} is not the connection's login {login!r} "
                "(RabbitMQ closes the channel: 406 PRECONDITION_FAILED)"
            )
    room = properties_room(frame_max)  # the same budget retry copies are fitted to
    if room is not None and len(data) > room:
        return (
            f"its properties take {len(data)} bytes, more than the {room} a content-header "
            f"frame leaves them at the connection's frame_max of {frame_max} "
            "(RabbitMQ closes the connection: 501 FRAME_ERROR)"
        )
    if max_message_size and len(body) > max_message_size:
        return (
            f"its body of {len(body)} bytes exceeds the broker's maximum message size of "
            f"{max_message_size} (MAX_MESSAGE_BYTES; RabbitMQ closes the channel: 406)"
        )
    return ""


class ConfirmChannel:
    """A confirm-mode channel whose publishes do not wait for their confirm.

    The broker sends ``basic.return`` for an unroutable mandatory message before its
    ``basic.ack``, so a return marks the oldest unconfirmed message with the same id,
    route and body (message ids alone are not unique: a requeue of rows copied from one
    message, a careless publisher). If the channel closes, ``broken`` says why and
    pending callbacks never fire: the owner drops the connection, and what waited on
    them is redelivered or published again.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        try:
            # pika has no public handle on a blocking channel's asynchronous twin.
            self.impl = async_channel(connection.raw.channel())
        except LOST as exc:
            raise ConnectionLost(describe(exc)) from exc
        self.next_tag = 1
        self.pending: dict[int, _Pending] = {}  # insertion order == tag order
        self._by_message: dict[Any, list[int]] = {}
        self.broken: BaseException | None = None
        self.on_broken: Callable[[], None] | None = None
        self.ready = False
        self._login = login_of(connection.url)
        self._frame_max = int(getattr(connection, "frame_max", 0) or 0)
        self._max_message_size = int(app_settings.MAX_MESSAGE_BYTES or 0)
        self._frames = FrameWriter(self.impl)
        self.impl.add_on_return_callback(self._on_return)
        self.impl.add_on_close_callback(self._on_close)
        # No need to wait for confirm.select-ok before publishing: the broker handles it
        # before any later publish on this channel, so delivery tags still start at 1.
        self.impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: self._set_ready()
        )

    @property
    def broken_reason(self) -> str | None:
        return None if self.broken is None else describe(self.broken)

    @property
    def refusal(self) -> str | None:
        """Why the broker closed this channel (or its connection) for what one message
        carried, if that is why it closed (``errors.refusal``); ``None`` otherwise."""
        return refusal(self.broken)

    def _set_ready(self) -> None:
        self.ready = True

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Mapping[str, Any] | Encoded,
        on_settled: Callable[[bool, bool], None],
    ) -> None:
        """Publish; ``properties`` are our mapping, or already encoded (:mod:`.wire`).

        Raises ``MessageRefused`` (nothing sent) for a message the broker would refuse for
        what it carries (:func:`early_refusal`)."""
        if self.broken is not None:
            raise ConnectionLost(f"confirm channel closed: {describe(self.broken)}")
        if isinstance(properties, Encoded):
            message_id, on_wire = properties.message_id, properties
        else:
            message_id = properties.get("message_id")
            on_wire = Encoded(encode_properties(properties), message_id)
        why = early_refusal(
            body,
            on_wire,
            login=self._login,
            frame_max=self._frame_max,
            max_message_size=self._max_message_size,
        )
        if why:
            raise MessageRefused(why, message_id)
        tag = self.next_tag
        self.next_tag += 1
        self.pending[tag] = _Pending(on_settled, message_id, exchange, routing_key, body)
        self._by_message.setdefault(message_id, []).append(tag)
        try:
            if not (
                self._frames.usable
                and self._frames.publish(exchange, routing_key, body, on_wire.data, True)
            ):
                self.impl.basic_publish(exchange, routing_key, body, on_wire, mandatory=True)
        except LOST as exc:
            raise ConnectionLost(describe(exc)) from exc

    def close(self) -> None:
        """Close the channel without waiting: pending callbacks never fire (their messages
        may be stored or not; the owner treats them as unanswered)."""
        if self.impl.is_open:
            with contextlib.suppress(*LOST):  # the connection is gone: so is the channel
                self.impl.close()

    def _on_return(self, _channel: Any, method: Any, properties: Any, body: bytes) -> None:
        for tag in self._by_message.get(properties.message_id, ()):
            entry = self.pending.get(tag)
            if (
                entry is not None
                and not entry.returned
                and entry.exchange == method.exchange
                and entry.routing_key == method.routing_key
                and entry.body == body
            ):
                entry.returned = True
                return
        logger.error("a returned message (id %r) matches no pending publish", properties.message_id)

    def _on_close(self, _channel: Any, reason: BaseException) -> None:
        self.broken = reason
        if self.on_broken is not None:
            self.on_broken()

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = confirmed_tags(self.pending, method.delivery_tag, method.multiple)
        acked = method.NAME == "Basic.Ack"
        for tag in tags:
            entry = self.pending.pop(tag)
            same = self._by_message.get(entry.message_id)
            if same is not None:
                same.remove(tag)
                if not same:
                    del self._by_message[entry.message_id]
            entry.on_settled(acked, entry.returned)


@dataclass(slots=True)
class _Pending:
    on_settled: Callable[[bool, bool], None]
    message_id: Any
    exchange: str
    routing_key: str
    body: bytes
    returned: bool = False


def confirmed_tags(pending: Collection[int], delivery_tag: int, multiple: bool) -> list[int]:
    """The tags of ``pending`` (in tag order) that a broker's ack or nack answers: up to
    ``delivery_tag`` with ``multiple``, else that one tag if it is pending (an answer for a
    tag no longer pending answers nothing)."""
    if not multiple:
        return [delivery_tag] if delivery_tag in pending else []
    tags = []
    for tag in pending:
        if tag > delivery_tag:
            break
        tags.append(tag)
    return tags


def settled_reason(acked: bool, returned: bool) -> str:
    """Why a publish did not count as stored ("" if it did)."""
    if acked and not returned:
        return ""
    return "returned as unroutable" if returned else "nacked by the broker"


class Outgoing:
    """One message of a batch and what the broker said about it.

    Its properties are a mapping, or bytes encoded when the message was written
    (``wire``: the outbox's rows), published as they are and decoded only if asked for.
    """

    __slots__ = (
        "_properties",
        "body",
        "exchange",
        "refused",
        "returned",
        "routing_key",
        "state",
        "wire",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Mapping[str, Any] | None,
        wire: Encoded | None = None,
    ) -> None:
        if properties is None and wire is None:
            raise TypeError("Outgoing needs its properties, as a mapping or encoded")
        self.exchange = exchange
        self.routing_key = routing_key
        self.body = body
        self._properties = properties
        self.wire = wire
        self.state = ""  # "" unsent/unknown, "ack", "nack", "refused"
        self.returned = False
        #: Why the broker refuses this message for what it carries (state "refused").
        self.refused = ""

    @property
    def properties(self) -> Mapping[str, Any]:
        if self._properties is None:
            assert self.wire is not None
            self._properties = self.wire.decode()
        return self._properties

    @property
    def message_id(self) -> Any:
        if self.wire is not None:
            return self.wire.message_id
        return self.properties.get("message_id")

    @property
    def confirmed(self) -> bool:
        """Acked by the broker and not returned: stored in at least one queue."""
        return self.state == "ack" and not self.returned

    @property
    def nacked(self) -> bool:
        return self.state == "nack"

    def refuse(self, reason: str) -> None:
        """The broker refuses this message for what it carries: a final answer."""
        self.state = "refused"
        self.refused = reason


class Sink(Protocol):
    """Where :meth:`Pipeline.run` puts each item it publishes (a list will do)."""

    def append(self, item: Outgoing, /) -> None: ...


@dataclass
class BatchOutcome:
    channel_error: str | None = None  # why the channel closed, if it did
    timed_out: bool = False
    #: The channel (or connection) closed because of what one message carried: which one of
    #: those without an answer is for the publisher to find.
    refusal: str | None = None


class Pipeline:
    """Publishes batches on a :class:`ConfirmChannel`, many confirms in flight.

    Messages are written back to back and the connection's I/O loop is pumped until at most
    a window's worth are unconfirmed, then until every one is acked or nacked. Raises
    ``ConnectionLost`` when the connection dies; a channel the broker closed (no such
    exchange) is reported in the outcome instead, and the pipeline is then unusable.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.channel = ConfirmChannel(connection)
        self.channel.on_broken = self._wake
        self.wake_at: int = -1  # wake the I/O loop once this few are unconfirmed
        self._woken = False
        deadline = time.monotonic() + STALL_TIMEOUT
        while not self.channel.ready:
            if self.channel.broken is not None:
                raise ConnectionLost(f"confirm.select failed: {self.channel.broken_reason}")
            if time.monotonic() > deadline:
                raise ConnectionLost("no confirm.select-ok from the broker")
            self._pump(0.05)

    @property
    def unconfirmed(self) -> int:
        return len(self.channel.pending)

    def usable(self, connection: Connection) -> bool:
        return (
            connection is self.connection
            and self.channel.broken is None
            and self.channel.impl.is_open
            and not self.channel.pending
        )

    # Callbacks (run inside the connection's I/O loop) ------------------------------------
    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            self.connection.raw.call_later(0, _noop)

    def _settle(self, item: Outgoing, acked: bool, returned: bool) -> None:
        item.state = "ack" if acked else "nack"
        item.returned = returned
        if self.unconfirmed <= self.wake_at:
            self._wake()

    # Driving -----------------------------------------------------------------------------
    def _pump(self, seconds: float) -> None:
        self._woken = False
        self.connection.pump(seconds)

    def _wait_until(self, at_most: int) -> bool:
        """Pump I/O until at most ``at_most`` messages are unconfirmed; False on a stall."""
        last = self.unconfirmed
        deadline = time.monotonic() + STALL_TIMEOUT
        while self.unconfirmed > at_most and self.channel.broken is None:
            self.wake_at = at_most
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._pump(min(remaining, 1.0))
            if self.unconfirmed < last:  # progress: the stall clock starts over
                last = self.unconfirmed
                deadline = time.monotonic() + STALL_TIMEOUT
        self.wake_at = -1
        return True

    def run(
        self, items: Iterable[Outgoing | None], window: int, sent: Sink | None = None
    ) -> BatchOutcome:
        """Publish ``items`` as the iterable yields them, then wait for every answer.

        The iterable may be lazy (rows read from a database cursor): reading the next ones
        overlaps the broker's work on those already written. It may yield ``None`` when it
        has nothing yet (it waits for the answers to what it gave): the I/O loop then runs
        for up to ``IDLE_PUMP`` seconds, and after ``STALL_TIMEOUT`` seconds of such waits
        without a new answer the outcome is ``timed_out``. Each item published is appended
        to ``sent`` (when given) before it is written.
        """
        outcome = BatchOutcome()
        low = window // 2
        number = 0
        waiting, stall_at = -1, 0.0  # the stall clock while the source has nothing
        for item in items:
            if item is None:  # the source has nothing yet: take in confirms meanwhile
                self._pump(IDLE_PUMP)
                # A source that waits for answers must not wait forever on a broker that
                # stopped answering: the same stall timeout as a full window.
                if waiting < 0 or self.unconfirmed < waiting or not self.unconfirmed:
                    waiting, stall_at = self.unconfirmed, time.monotonic() + STALL_TIMEOUT
                elif time.monotonic() > stall_at:
                    outcome.timed_out = True
                    return outcome
                continue
            waiting = -1  # published: the clock starts again at the next wait
            number += 1
            if self.unconfirmed >= window and not self._wait_until(low):
                outcome.timed_out = True
                return outcome
            if self.channel.broken is not None:
                break
            item.state = ""
            item.returned = False
            if sent is not None:
                sent.append(item)
            try:
                self.channel.publish(
                    item.exchange,
                    item.routing_key,
                    item.body,
                    item.properties if item.wire is None else item.wire,
                    functools.partial(self._settle, item),
                )
            except MessageRefused as exc:  # not sent: its answer is known already
                item.refuse(exc.reason)
                continue
            if number % FLUSH_EVERY == 0:
                # Frames wait in pika's buffer until the I/O loop runs: hand them to the
                # socket (and take in confirms) while the next ones are marshalled.
                self._pump(0)
        if self.channel.broken is None and not self._wait_until(0):
            outcome.timed_out = True
        if self.channel.broken is not None:
            outcome.channel_error = self.channel.broken_reason
            outcome.refusal = self.channel.refusal
        return outcome


def _noop() -> None:
    """Timer callback whose only job is to make ``process_data_events`` return."""


__all__ = [
    "BatchOutcome",
    "ConfirmChannel",
    "Outgoing",
    "Pipeline",
    "early_refusal",
    "settled_reason",
]
