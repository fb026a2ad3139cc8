"""A delivery as plain data, and what the consumer's loop must do with it once handled.

The handler (``consumer.handler``) turns a :class:`Delivery` into one action; the engine
(``consumer.engine``) or the in-memory test broker (``testing``) carries it out. Neither side
sees the other's machinery: no pika here, no receiver code there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .. import signals
from ..parking import ParkRequest
from ..registry import Receiver

logger = logging.getLogger("django_rmq_retry.consumer")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as the broker handed it to us."""

    queue: str
    receiver: Receiver | None  # None: the orphans queue
    exchange: str
    routing_key: str
    redelivered: bool
    properties: dict[str, Any]  # every AMQP property by its attribute name, headers included
    body: bytes
    tag: int = 0  # the broker's delivery tag on this consumer's channel
    generation: int = 0  # which connection of the consumer it came in on


@dataclass(frozen=True)
class Ack:
    """Done with it: the receiver returned, or (``kind="parked"``) its row is committed."""

    kind: str = "handled"  # or "parked" ("held": a gate set it aside): what stats count
    start_key: str | None = None  # the delivery-limit row to delete once the ack is sent


#: A receiver returned and no delivery-limit row waits: one shared (immutable) action.
HANDLED = Ack()


@dataclass(frozen=True)
class Release:
    """Give the delivery back to the queue (shutdown while it could not be parked).

    Counts against the message's give-back budget: its delivery-limit row is kept. A gate's
    give-back (``consumer.gates``) is not ``counted``: no receiver started, its
    delivery-limit row (``start_key``) is forgotten, and it goes back after ``wait``
    seconds, the delivery unacked meanwhile (the loop holds it, never a receiver thread).
    """

    cause: str = "it was released unfinished"  # named by the parked row if it loops
    counted: bool = True
    wait: float = 0.0
    start_key: str | None = None  # (not counted) the delivery-limit row to forget


@dataclass(frozen=True)
class RetryInPlace(Release):
    """The quorum-native delay engine's retry (``core.native_retry``): give the delivery
    back with ``basic.reject(requeue=True)``; its quorum queue counts it and holds it for
    the policy's delay. Not counted by the delivery limit (the broker counts it);
    announced as a confirmed retry copy is (log line, ``message_retried``) as it settles."""

    counted: bool = False
    log_line: str = ""
    log_extra: dict[str, Any] | None = None
    signal_kwargs: dict[str, Any] = field(default_factory=dict)

    def announce(self) -> None:
        """Log the retry and send ``message_retried`` (notifier thread, never the I/O one)."""
        _announce(self.log_line, self.log_extra, self.signal_kwargs)


@dataclass(frozen=True)
class PublishRetry:
    """Publish this copy into the delay path; ack the original once the broker confirmed it."""

    exchange: str
    routing_key: str
    body: bytes
    properties: dict[str, Any]
    log_line: str
    signal_kwargs: dict[str, Any] = field(default_factory=dict)
    start_key: str | None = None  # the delivery-limit row to delete once the original is acked
    log_extra: dict[str, Any] | None = None  # the log line's message fields (core.logfields)
    #: ``properties`` already encoded for the wire, when the handler measured them against
    #: the frame limit (published as they are: encoded once, not twice).
    wire: Any = None

    def announce(self) -> None:
        """The broker confirmed the copy: log it and send ``message_retried``.

        Signal handlers are user code of any speed: the consumer calls this from its
        notifier thread, never from the connection's I/O thread.
        """
        _announce(self.log_line, self.log_extra, self.signal_kwargs)


@dataclass(frozen=True)
class PublishHold(PublishRetry):
    """A gate's hold (``consumer.gates``): a copy, same attempt, waits in the delay levels
    and comes back; the original is acked once the broker confirmed the copy. Carried out
    as a retry copy is, but nothing failed: logged at INFO, no ``message_retried``."""

    def announce(self) -> None:
        logger.info(self.log_line, extra=self.log_extra)


@dataclass(frozen=True)
class StorePark:
    """Write this row (the parking thread commits it); ack once it is committed."""

    request: ParkRequest
    start_key: str | None  # the delivery-limit row to delete once parked
    log_line: str


Action = Ack | Release | PublishRetry | StorePark


def retried_kwargs(
    receiver_name: str, message: Any, attempt: int, delay_s: float, error: BaseException
) -> dict[str, Any]:
    """``message_retried``'s arguments, as every kind of retry sends them (a copy into the
    delay levels, a give-back its quorum queue holds)."""
    return {
        "sender": receiver_name,
        "message": message,
        "attempt": attempt,
        "delay": delay_s,
        "error": error,
    }


def _announce(log_line: str, extra: dict[str, Any] | None, signal_kwargs: dict[str, Any]) -> None:
    """A retry is on its way: its WARNING line and ``message_retried``."""
    logger.warning(log_line, extra=extra)
    for _receiver, result in signals.message_retried.send_robust(**signal_kwargs):
        if isinstance(result, Exception):
            logger.error("a message_retried signal receiver failed: %r", result)
