"""The hooks (``django_rmq_retry.hooks``) that feed metrics, traces and health probes.

Each part (``metrics.ConsumerMetrics``, ``tracing.Tracing``, ``health.Health``) implements
the hooks it needs, in the shape of :class:`Part`. The :class:`Observer` is what the
consumer calls: at start-up it lists, per hook, the parts that implement it, so a call
reaches only those (a hook no part implements is the no-op of ``Hooks``), and it reads the
clock once per attempt for every part (a span's start and end, the duration histogram).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..core.message import Message
from ..core.names import Names
from ..hooks import Hooks, SendEvent

logger = logging.getLogger("django_rmq_retry.observability")

#: The hooks that wrap nothing (each call fans out to the parts that implement it).
PLAIN = (
    "retry_copy",
    "settled",
    "loop_tick",
    "loop_blocked",
    "reconnecting",
    "parked_batch",
    "stopped",
)
#: A part's token when its ``*_started`` failed: its ``*_ended`` is not called.
FAILED = object()


class Part(Hooks):
    """One part of observability. The timed hooks get the time the observer read for all
    its parts (``now``: ``time.time_ns()``, what OpenTelemetry's SDK reads)."""

    def attempt_started(self, message: Message, now: int = 0) -> Any:
        return None

    def attempt_ended(
        self, token: Any, error: BaseException | None, action: Any, now: int = 0, took: int = 0
    ) -> None:
        """``took``: nanoseconds since :meth:`attempt_started`'s ``now``."""

    def stopped(self) -> None:
        """The consumer returned: not ready any more."""

    def requeued(self, parked_ids: list[int], user: str, mode: str) -> None:
        """An operator requeued parked rows (``message_requeued``)."""


def implements(part: object, name: str) -> bool:
    """``part`` has a hook ``name`` of its own (not the no-op it inherits)."""
    own = getattr(type(part), name, None)
    return own is not None and own is not getattr(Part, name, None)


class Observer(Hooks):
    """Calls each enabled part: ``metrics`` (``metrics.ConsumerMetrics``), ``tracing``
    (``tracing.Tracing``), ``health`` (``health.Health``); ``None`` parts cost nothing.

    A part that fails (a broken exporter, a bug of ours) is logged, once per hook, and
    otherwise ignored: observability never stops a consumer (nor settles a message).
    """

    def __init__(
        self,
        names: Names,
        *,
        metrics: Any = None,
        tracing: Any = None,
        health: Any = None,
    ) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self.health = health
        # Tracing first: its span is current while the other parts run.
        self.parts = [p for p in (tracing, metrics, health) if p is not None]
        self._said: set[str] = set()
        self._attempts = [
            (p.attempt_started, p.attempt_ended)
            for p in self.parts
            if implements(p, "attempt_started")
        ]
        self._sends = [
            (p.send_started, p.send_ended) for p in self.parts if implements(p, "send_started")
        ]
        for name in PLAIN:
            calls = [getattr(p, name) for p in self.parts if implements(p, name)]
            if calls:
                setattr(self, name, self._fan_out(name, calls))

    def _failed(self, hook: str) -> None:
        if hook not in self._said:
            self._said.add(hook)
            logger.exception("observability hook %s failed (said once)", hook)

    def _fan_out(self, name: str, calls: list[Callable[..., None]]) -> Callable[..., None]:
        """One hook's dispatch, built once: each call in turn, none raising."""

        def each(*args: Any) -> None:
            for call in calls:
                try:
                    call(*args)
                except Exception:
                    self._failed(name)

        return each

    def _started(self, hook: str, pairs: Iterable[tuple[Any, Any]], *args: Any) -> list[Any]:
        tokens = []
        for started, _ended in pairs:
            try:
                tokens.append(started(*args))
            except Exception:
                tokens.append(FAILED)
                self._failed(hook)
        return tokens

    def _ended(
        self, hook: str, pairs: Iterable[tuple[Any, Any]], tokens: list[Any], *args: Any
    ) -> None:
        """Each part's ``*_ended`` with its own token, skipping parts whose start failed."""
        for (_started, ended), part_token in zip(pairs, tokens, strict=True):
            if part_token is FAILED:
                continue
            try:
                ended(part_token, *args)
            except Exception:
                self._failed(hook)

    # Receiver attempts (receiver threads) ----------------------------------------------------
    def attempt_started(self, message: Message) -> Any:
        if not self._attempts:
            return None
        now = time.time_ns()
        return now, self._started("attempt_started", self._attempts, message, now)

    def attempt_ended(self, token: Any, error: BaseException | None, action: Any) -> None:
        if token is None:
            return
        started, tokens = token
        now = time.time_ns()
        took = max(0, now - started)  # the wall clock may step back
        self._ended("attempt_ended", self._attempts, tokens, error, action, now, took)

    # Sending (any thread that publishes) -----------------------------------------------------
    def send_started(self, out: SendEvent) -> Any:
        return self._started("send_started", self._sends, out) if self._sends else None

    def send_ended(self, token: Any, error: BaseException | None) -> None:
        if token is not None:
            self._ended("send_ended", self._sends, token, error)

    def stopped(self) -> None:
        """The consumer returned: not ready any more (each part that cares)."""

    def requeued(self, sender: Any, parked_ids: list[int], user: str, mode: str, **_: Any) -> None:
        """``message_requeued`` (connected while tracing is on)."""
        if self.tracing is not None:
            try:
                self.tracing.requeued(parked_ids, user, mode)
            except Exception:  # tracing never fails a requeue
                logger.exception("tracing a requeue failed")


def lateness(headers: dict[str, Any], due: str, due_us: str, now: float) -> float | None:
    """Seconds between a retry's due time (our headers) and ``now`` (Unix seconds);
    ``None`` without one."""
    value = headers.get(due_us)
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0.0, now - value / 1e6)
    value = headers.get(due)
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0.0, now - value / 1e3)
    return None
