"""What the consumer and ``send`` tell observability: one small interface, no-ops here.

The consumer calls these at a receiver attempt's start and end, when a delivery is settled
(acked, retried, parked, released), on each turn of its I/O loop and at a reconnect; the
parking thread after each committed batch; ``Topic.send`` around a publish. Metrics, traces
and health probes (``django_rmq_retry.observability``) implement them, and are imported only
when a project turns them on (``rmq_consume --metrics-port``, the ``TRACING`` setting...).
Until then :data:`current` is ``None`` and each call site costs one ``is not None`` test:
nothing of prometheus-client or OpenTelemetry is imported.

Every method may be called from any thread (receiver threads, the connection's thread, the
parking thread), must be quick, and must never raise into the consumer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any

from .core.message import Message


class Hooks:
    """The interface, each method doing nothing (subclass and override what you need)."""

    def attempt_started(self, message: Message) -> Any:
        """A receiver is about to run ``message`` (on the thread that runs it). What it
        returns is handed back to :meth:`attempt_ended` (a start time, a span...)."""
        return None

    def attempt_ended(self, token: Any, error: BaseException | None, action: Any) -> None:
        """The attempt is over and decided: ``action`` is what the consumer does next
        (``consumer.actions``: an ack, a retry copy to publish, a row to park). A retry
        copy's headers (``action.properties["headers"]``) may still be added to here."""

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

    def reconnecting(self) -> None:
        """The consumer lost (or could not open) its connection and connects again."""

    def parked_batch(self, size: int, lag_seconds: float) -> None:
        """The parking thread committed ``size`` rows; the oldest waited ``lag_seconds``
        between its receiver's decision and the commit."""

    @contextlib.contextmanager
    def sending(
        self,
        routing_key: str,
        headers: MutableMapping[str, Any],
        outbox: bool,
        count: int = 1,
        properties: MutableMapping[str, Any] | None = None,
    ) -> Iterator[None]:
        """Around one ``send`` (or ``send_many`` of ``count`` bodies): may add headers (a
        trace context) before it publishes, or (``outbox``) writes its outbox row(s).
        ``properties`` (one ``send``): the caller's message properties, ``message_id``
        may be set there (as the publisher would)."""
        yield


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
