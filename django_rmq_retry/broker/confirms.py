"""What every publish with confirms shares: the message and its answer, and what we can
tell before the broker does.

Every publish goes through ``window.ConfirmWindow`` on a link; it uses :class:`Outgoing`
(one message and its answer), :func:`early_refusal` (a refusal known before sending) and
:func:`confirmed_tags` (which publishes a broker's ack or nack answers).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from ..core.header_budget import properties_room
from .wire import Encoded, decode_properties

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
    "Outgoing",
    "early_refusal",
    "settled_reason",
]
