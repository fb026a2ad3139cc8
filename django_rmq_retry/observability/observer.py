"""The hooks (``django_rmq_retry.hooks``) that feed metrics, traces and health probes."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, TypeVar

from ..core.message import Message
from ..core.names import Names
from ..hooks import Hooks
from .health import Health

logger = logging.getLogger("django_rmq_retry.observability")

F = TypeVar("F", bound=Callable[..., Any])


def never_raises(method: F) -> F:
    """A hook that fails (a broken exporter, a bug of ours) is logged, once per hook, and
    otherwise ignored: observability never stops a consumer (nor settles a message)."""
    failed = False

    @functools.wraps(method)
    def safe(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed
        try:
            return method(*args, **kwargs)
        except Exception:
            if not failed:
                failed = True
                logger.exception("observability hook %s failed (said once)", method.__name__)
            return None

    return safe  # type: ignore[return-value]


class Observer(Hooks):
    """Calls each enabled part: ``metrics`` (``metrics.ConsumerMetrics``), ``tracing``
    (``tracing.Tracing``), ``health`` (``health.Health``); ``None`` parts cost nothing."""

    def __init__(
        self,
        names: Names,
        *,
        metrics: Any = None,
        tracing: Any = None,
        health: Health | None = None,
    ) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self.health = health
        self._due = names.header("due")
        self._due_us = names.header("due-us")
        self._beat_set = 0.0
        self._ready: bool | None = None
        # Per-receiver metric children, looked up once (labels() costs ~1 µs a call).
        self._per_receiver: dict[str, tuple[Any, Any, Any]] = {}
        self._per_outcome: dict[tuple[str, str], Any] = {}

    def _children(self, receiver: str) -> tuple[Any, Any, Any]:
        """(in_flight, duration, lateness) of ``receiver``."""
        found = self._per_receiver.get(receiver)
        if found is None:
            m = self.metrics
            found = (
                m.in_flight.labels(receiver),
                m.duration.labels(receiver),
                m.lateness.labels(receiver),
            )
            self._per_receiver[receiver] = found
        return found

    # Receiver attempts (receiver threads) ----------------------------------------------------
    @never_raises
    def attempt_started(self, message: Message) -> Any:
        span = self.tracing.start(message) if self.tracing is not None else None
        if self.metrics is not None:
            in_flight, _duration, late_by = self._children(message.receiver)
            in_flight.inc()
            if message.attempt > 1:
                late = lateness(message.headers, self._due, self._due_us)
                if late is not None:
                    late_by.observe(late)
        return (time.perf_counter(), message.receiver, span)

    @never_raises
    def attempt_ended(self, token: Any, error: BaseException | None, action: Any) -> None:
        if token is None:  # attempt_started failed
            return
        started, receiver, span = token
        if self.tracing is not None:
            self.tracing.end(span, error, action)
        if self.metrics is not None:
            in_flight, duration, _late_by = self._children(receiver)
            duration.observe(time.perf_counter() - started)
            in_flight.dec()

    # The consumer's threads -------------------------------------------------------------------
    @never_raises
    def settled(self, receiver: str, queue: str, outcome: str) -> None:
        if self.metrics is not None:
            child = self._per_outcome.get((receiver, outcome))
            if child is None:
                child = self._per_outcome[receiver, outcome] = self.metrics.messages.labels(
                    receiver, outcome
                )
            child.inc()

    @never_raises
    def loop_tick(self, ready: bool) -> None:
        if self.health is not None:
            self.health.tick(ready)
        m = self.metrics
        if m is not None:
            now = time.time()
            if ready is not self._ready or now - self._beat_set >= 1.0:
                self._ready = ready
                self._beat_set = now
                m.ready.set(1 if ready else 0)
                m.heartbeat.set(now)

    @never_raises
    def reconnecting(self) -> None:
        if self.metrics is not None:
            self.metrics.reconnects.inc()

    @never_raises
    def parked_batch(self, size: int, lag_seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.park_batch.observe(size)
            self.metrics.park_lag.observe(lag_seconds)

    def requeued(self, sender: Any, parked_ids: list[int], user: str, mode: str, **_: Any) -> None:
        """``message_requeued`` (connected while tracing is on)."""
        if self.tracing is not None:
            try:
                self.tracing.requeued(parked_ids, user, mode)
            except Exception:  # tracing never fails a requeue
                logger.exception("tracing a requeue failed")

    @never_raises
    def retry_copy(self, headers: MutableMapping[str, Any]) -> None:
        if self.tracing is not None:
            self.tracing.retry_copy(headers)

    @contextlib.contextmanager
    def sending(
        self,
        routing_key: str,
        headers: MutableMapping[str, Any],
        outbox: bool,
        count: int = 1,
        properties: MutableMapping[str, Any] | None = None,
    ) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.tracing is not None:
                stack.enter_context(
                    self.tracing.sending(routing_key, headers, outbox, count, properties)
                )
            try:
                yield
            except BaseException:
                if self.metrics is not None:
                    self.metrics.published.labels("failed").inc(count)
                raise
            if self.metrics is not None:
                self.metrics.published.labels("outboxed" if outbox else "confirmed").inc(count)

    def stopped(self) -> None:
        """The consumer returned: not ready any more."""
        if self.health is not None:
            self.health.stopped()
        if self.metrics is not None:
            self.metrics.ready.set(0)


def lateness(headers: dict[str, Any], due: str, due_us: str) -> float | None:
    """Seconds between a retry's due time (our headers) and now; ``None`` without one."""
    value = headers.get(due_us)
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0.0, time.time() - value / 1e6)
    value = headers.get(due)
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0.0, time.time() - value / 1e3)
    return None
