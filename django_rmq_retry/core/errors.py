"""Exceptions: the ones receivers raise to steer, and the ones we raise to callers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Retry(Exception):
    """Raised by a receiver to ask for another attempt, optionally after ``delay`` seconds.

    The receiver's max attempts still apply: on the last attempt the message is parked.
    """

    def __init__(self, reason: str = "", *, delay: float | None = None) -> None:
        super().__init__(reason or "retry requested")
        if delay is not None and delay < 0:
            raise ValueError("Retry(delay=...) must be >= 0 seconds")
        self.delay = delay


class Reject(Exception):
    """Raised by a receiver to park the message at once, without retries."""

    def __init__(self, reason: str = "rejected by receiver") -> None:
        super().__init__(reason)
        self.reason = reason


class RmqRetryError(Exception):
    """Base class of the errors this library raises to its callers."""


class BrokerUnavailable(RmqRetryError):
    """The broker could not be reached or refused us (one readable line, no secrets)."""


class PublishError(RmqRetryError):
    """A message was not confirmed by the broker (nacked, unroutable or connection lost).

    Raised by a publish of several messages (``send_many``), it says which of them the
    broker did confirm: ``confirmed`` holds their ``PublishResult`` and ``failed`` the
    message ids of the others. Both are empty when the broker could not be reached at
    all (nothing was published).
    """

    confirmed: list[Any]
    failed: list[Any]

    def __init__(
        self, *args: object, confirmed: Iterable[Any] = (), failed: Iterable[Any] = ()
    ) -> None:
        super().__init__(*args)
        self.confirmed = list(confirmed)
        self.failed = list(failed)


class UnroutableError(PublishError):
    """The broker had no queue for the message (returned as mandatory)."""


class TopologyError(RmqRetryError):
    """Declaring our exchanges/queues failed, e.g. a queue exists with other arguments."""


class AccessRefused(BrokerUnavailable):
    """The broker refused our login or the virtual host: retrying will not help."""


class ConnectionLost(RmqRetryError):
    """The connection (or a channel of it) is gone mid-use; a new one may work."""


class ChannelClosed(ConnectionLost):
    """The broker closed a channel with a reply code (404 no such exchange, 406, ...)."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text


class NackedError(PublishError):
    """The broker refused (nacked) a message."""


class MessageRefused(PublishError):
    """The broker refuses this message for what it carries, not for being unreachable: a
    ``user_id`` that is not the connection's login, properties too large for a frame, a body
    over the broker's maximum message size, an exchange this login may not write to.
    Publishing it again will not help; the messages beside it are not concerned."""

    def __init__(
        self,
        reason: str,
        message_id: object = None,
        *,
        confirmed: Iterable[Any] = (),
        failed: Iterable[Any] = (),
    ) -> None:
        super().__init__(reason, confirmed=confirmed, failed=failed)
        self.reason = reason
        self.message_id = message_id


class ValidationError(RmqRetryError, ValueError):
    """A body that does not fit its topic's (or receiver's) schema.

    ``errors`` names each failing field: ``[{"loc": ["items", 0, "sku"], "msg": "..."}]``
    (``loc`` is empty when the body as a whole is wrong, e.g. a list for an object). The
    same list is kept on the parked row of an invalid message (``field_errors``) and shown
    next to the JSON when an operator's edit does not fit.
    """

    def __init__(self, errors: Iterable[FieldError], schema: str = "") -> None:
        self.errors: list[FieldError] = [
            {"loc": list(e.get("loc") or []), "msg": str(e.get("msg", ""))} for e in errors
        ]
        self.schema = schema
        super().__init__(describe_field_errors(self.errors, schema))


FieldError = dict[str, Any]
"""One failing field: ``{"loc": [...], "msg": "..."}``."""


def describe_field_errors(errors: Iterable[FieldError], schema: str = "", most: int = 5) -> str:
    """One readable line for ``errors`` (the first ``most``): ``amount: Field required; ...``."""
    errors = list(errors)
    parts = [
        f"{'.'.join(str(p) for p in e.get('loc') or []) or '(body)'}: {e.get('msg')}"
        for e in errors[:most]
    ]
    if len(errors) > most:
        parts.append(f"and {len(errors) - most} more")
    what = f"does not fit {schema}" if schema else "is invalid"
    return f"the body {what}: " + "; ".join(parts)
