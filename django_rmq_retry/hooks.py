"""What the consumer and ``send`` tell observability: one small interface, no-ops here.

The consumer calls these at a receiver attempt's start and end, when a delivery is settled
(acked, retried, parked, released), on each turn of its I/O loop and at a reconnect; the
watchdog of ``async def`` receivers while one blocks their event loop; the parking thread
after each committed batch; ``Topic.send`` around a publish. Metrics, traces
and health probes (``django_rmq_retry.observability``) implement them, and are imported only
when a project turns them on (``rmq_consume --metrics-port``, the ``TRACING`` setting...).
Until then :data:`current` is ``None`` and each call site costs one ``is not None`` test:
nothing of prometheus-client or OpenTelemetry is imported.

Every method may be called from any thread (receiver threads, the consumer's loop, the
parking thread), must be quick, and must never raise into the consumer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from .core.message import Message


@dataclass(slots=True)
class SendEvent:
    """One ``send`` (or ``send_many`` of ``count`` bodies) as the hooks see it."""

    routing_key: str
    #: The message's headers: a hook may add to them (a trace context) before it publishes.
    headers: MutableMapping[str, Any]
    #: Written to the outbox (in the caller's transaction) rather than published now.
    outbox: bool
    count: int = 1
    #: One ``send``'s message properties: a hook may set ``message_id`` there (as the
    #: publisher would) to name it. ``None`` for ``send_many``.
    properties: MutableMapping[str, Any] | None = None


class Hooks:
    """The interface, each method doing nothing (subclass and override what you need).

    Whatever wraps something has one shape: a ``*_started`` call returns a token that its
    ``*_ended`` call is handed back with what was raised (``None``: nothing).
    """

    def attempt_started(self, message: Message) -> Any:
        """A receiver is about to run ``message`` (on the thread that runs it). What it
        returns is handed back to :meth:`attempt_ended` (a start time, a span...)."""
        return None

    def attempt_ended(self, token: Any, error: BaseException | None, action: Any) -> None:
        """The attempt is over and decided: ``action`` is what the consumer does next
        (``consumer.actions``: an ack, a retry copy to publish, a row to park)."""

    def retry_copy(self, headers: MutableMapping[str, Any]) -> None:
        """A retry copy's headers, on the receiver's thread while its attempt is current
        (between :meth:`attempt_started` and :meth:`attempt_ended`): may add to them."""

    def settled(self, receiver: str, queue: str, outcome: str) -> None:
        """A delivery was settled: ``outcome`` is ``acked``, ``retried`` (its copy confirmed,
        the original acked), ``parked`` (its row committed, acked), ``released`` (given
        back to its queue) or ``retry_refused`` (its copy refused; the original given back)."""

    def loop_tick(self, ready: bool) -> None:
        """The consumer's I/O loop turned (several times a second while it runs). ``ready``:
        it consumes every queue it was asked to."""

    def loop_blocked(self, receiver: str | None, seconds: float) -> None:
        """The event loop of ``async def`` receivers has not turned for ``seconds``: the
        receiver named ``receiver`` blocks it (``"?"``: no receiver on the loop's stack).
        Called several times a second while it lasts, then once with ``receiver=None`` and
        ``seconds=0`` when the loop turns again (``consumer.watchdog``)."""

    def reconnecting(self) -> None:
        """The consumer lost (or could not open) its connection and connects again."""

    def parked_batch(self, size: int, lag_seconds: float) -> None:
        """The parking thread committed ``size`` rows; the oldest waited ``lag_seconds``
        between its receiver's decision and the commit."""

    def send_started(self, out: SendEvent) -> Any:
        """A ``send`` is about to publish (or write its outbox row(s)): may add headers.
        What it returns is handed back to :meth:`send_ended`."""
        return None

    def send_ended(self, token: Any, error: BaseException | None) -> None:
        """The ``send`` returned (``error``: what it raised)."""

    @contextlib.contextmanager
    def sending(self, out: SendEvent) -> Iterator[None]:
        """:meth:`send_started` and :meth:`send_ended` around the ``with`` block."""
        token = self.send_started(out)
        try:
            yield
        except BaseException as exc:
            self.send_ended(token, exc)
            raise
        self.send_ended(token, None)


#: Set by the supervisor of ``rmq_consume --processes N`` in its children's environment:
#: the directory where each child writes its health files (and, with metrics, its samples).
CHILD_DIR_ENV = "DJANGO_RMQ_RETRY_OBSERVABILITY_DIR"

#: The hooks in use in this process (``None``: observability is off, nothing is called).
current: Hooks | None = None


def install(hooks: Hooks | None) -> Hooks | None:
    """Use ``hooks`` from now on in this process (``None``: off); returns the previous."""
    global current
    previous, current = current, hooks
    return previous
