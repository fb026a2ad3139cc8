"""Confirms in flight on a blocking connection, and what every publish shares.

``BlockingChannel.basic_publish`` waits for each confirm before returning: one round trip per
message. :class:`ConfirmChannel` puts pika's underlying channel in confirm mode with our own
callbacks, so ``publish`` returns at once and ``on_settled(acked, returned)`` runs inside the
connection's I/O loop once the broker answered: the blocking consumer's retry copies. Every
other publish goes through ``window.ConfirmWindow`` on a link; both use :class:`Outgoing`
(one message and its answer), :func:`early_refusal` and :func:`confirmed_tags`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ..conf import app_settings
from ..core.errors import ConnectionLost, MessageRefused
from ..core.header_budget import properties_room
from .connection import Connection
from .pikaext import FrameWriter, async_channel
from .translate import LOST, describe, refusal
from .wire import Encoded, decode_properties, encode_properties

logger = logging.getLogger("django_rmq_retry.broker")

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


__all__ = [
    "ConfirmChannel",
    "Outgoing",
    "early_refusal",
    "settled_reason",
]
