"""``InMemoryBroker``: your receivers, retries and parking in a test, without RabbitMQ.

``Topic.send`` publishes into an in-memory model of the broker (``model``) that holds the
same topology the real one gets: work exchange, receiver queues, the delay levels with their
TTLs and dead-lettering, the deliver exchange and its orphans. :meth:`run_until_idle`
delivers every message to the consumer's own handler (``consumer.handler``, the code the
real consumer runs), carries out the action it returns, and moves a virtual clock to the
next delay level's expiry whenever nothing is ready, so a retry schedule of days runs in
milliseconds. Parked rows, ``RetryPolicy`` rows, signals and log lines are the real ones.

Everything runs in the calling thread, on the test's database connection: inside Django's
``TestCase`` (or pytest-django's ``django_db``) the rows live in the test's transaction, and
``on_commit`` callbacks (the ``message_parked`` signal, a receiver's ``send_on_commit``)
run at the end of each delivery, as they would after a real commit.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.db import transaction
from django.test import TestCase

from ..conf import (
    app_settings,
    code_policy,
    current_levels,
    current_names,
    current_plan,
    ordering_partitions,
)
from ..consumer.actions import (
    Ack,
    Action,
    Delivery,
    PublishHold,
    PublishRetry,
    Release,
    RetryInPlace,
    StorePark,
)
from ..consumer.delivery_limit import DeliveryLimit
from ..consumer.handler import Handler
from ..consumer.park_writer import ParkJob, commit
from ..core.bodies import Undecodable, decode_body
from ..core.envelope import MAX_ATTEMPT, read_incoming
from ..core.native_retry import DELIVERY_COUNT, delivery_count, native_retry
from ..core.native_retry import attempt as native_attempt
from ..core.topology_plan import receiver_queues
from ..outbox import publish_all, rows_written
from ..publishing.per_thread import install
from ..publishing.publisher import Publisher
from ..registry import Receiver, default_registry
from ..registry.policies import policy_cache
from .breakers import MemoryBreakers
from .model import MemoryBroker, Stored

#: Deliveries one :meth:`InMemoryBroker.run_until_idle` makes at most before it gives up.
MAX_DELIVERIES = 10_000


@dataclass(frozen=True)
class ReceiverRun:
    """One delivery to a receiver, and how it ended."""

    receiver: str  # dotted path of the receiver ("" for the orphans queue)
    message_id: str | None
    attempt: int
    #: "handled", "retried", "parked", "released" (given back to its queue), or what a gate
    #: (``consumer.gates``) decided before the receiver ran: "held" (a copy waits in the
    #: delay levels), "given_back" (back to its queue after a wait, nothing counted) or
    #: "set_aside" (per-key order: behind its key's blocker, in the database).
    outcome: str
    at: float  # virtual seconds since the broker started
    delay: float | None = None  # retried: seconds until the next attempt
    reason: str | None = None  # parked: the park reason ("exhausted", "rejected", ...)


@dataclass(frozen=True)
class SentMessage:
    """A message published to the work exchange (``Topic.send`` and friends)."""

    routing_key: str
    body: Any  # decoded as a receiver would see it (JSON value, str, or bytes)
    raw: bytes
    properties: dict[str, Any]


class InMemoryBroker:
    """A broker in memory for tests; see the module docstring.

    Use it as a context manager (``with InMemoryBroker() as broker: ...``) or through the
    pytest fixture ``rmq_broker`` (``pytest_plugins = ["django_rmq_retry.testing.pytest_plugin"]``).
    ``receivers`` defaults to every registered receiver; ``seed`` makes jitter repeatable.
    """

    def __init__(self, receivers: Iterable[Receiver] | None = None, *, seed: int = 0) -> None:
        self.names = current_names()
        self.receivers = list(receivers) if receivers is not None else default_registry.all()
        self._start_ms = int(time.time() * 1000)
        self.model = MemoryBroker(self._start_ms)
        # Like the first publish of a process: the topology of every registered receiver.
        self.model.declare(current_plan(default_registry.all(), self.names))
        self._limits = DeliveryLimit(
            self.names, int(app_settings.DELIVERY_LIMIT), broker_counts=False
        )
        self.handler = Handler(
            self.names,
            current_levels(),
            limits=self._limits,
            clock=lambda: self.now,
            rng=random.Random(seed),
        )
        partitions = ordering_partitions()  # an ordered receiver reads its partition queues
        self._by_queue: dict[str, Receiver | None] = {
            q: r for r in self.receivers for q in receiver_queues(r, self.names.prefix, partitions)
        }
        self._by_queue[self.names.orphan_queue] = None
        #: Dependency breakers: a queue whose breaker is open is not consumed (``breakers``).
        self.breakers = MemoryBreakers(self.receivers)
        self.runs: list[ReceiverRun] = []
        #: Gates' give-backs waiting out their wait: (virtual due ms, queue, message).
        self._given_back: list[tuple[int, str, Stored]] = []
        self.sent: list[SentMessage] = []
        self.publisher = _MemoryPublisher(self)
        self._previous: Any = None

    # Lifecycle -----------------------------------------------------------------------------
    def start(self) -> InMemoryBroker:
        """Publish into this broker from now on (``Topic.send``, requeues, ...)."""
        self._previous = install(self.publisher)
        policy_cache.invalidate()
        return self

    def stop(self) -> None:
        """Give publishing back to whatever did it before."""
        install(self._previous)
        policy_cache.invalidate()

    def __enter__(self) -> InMemoryBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Time ----------------------------------------------------------------------------------
    @property
    def now(self) -> datetime:
        """The virtual time (it starts at the real time the broker was made)."""
        return datetime.fromtimestamp(self.model.now_ms / 1000, tz=timezone.utc)

    @property
    def elapsed(self) -> float:
        """Virtual seconds since the broker was made."""
        return (self.model.now_ms - self._start_ms) / 1000

    def advance(self, seconds: float) -> None:
        """Move the virtual clock on (messages due meanwhile move through the delay levels)."""
        self.model.advance_to(self.model.now_ms + int(seconds * 1000))

    # Running -------------------------------------------------------------------------------
    def run_until_idle(self, *, max_deliveries: int = MAX_DELIVERIES) -> list[ReceiverRun]:
        """Deliver until no message is left in a consumed queue or a delay level.

        Whenever nothing is ready, the virtual clock jumps to the next delay level's expiry.
        Returns the receiver runs of this call (``runs`` keeps all of them). Raises
        ``RuntimeError`` after ``max_deliveries`` deliveries: a message that keeps coming
        back would otherwise never let it end.
        """
        first = len(self.runs)
        while True:
            self._deliver_ready(max_deliveries - (len(self.runs) - first))
            due = self.model.next_expiry_ms()
            if self._given_back:
                back = min(at for at, _q, _m in self._given_back)
                due = back if due is None else min(due, back)
            probe = self.breakers.next_probe_ms() if self._waiting_for_breaker() else None
            if probe is not None:
                due = probe if due is None else min(due, probe)
            if due is None:
                return self.runs[first:]
            self.model.advance_to(due)

    def run_ready(self, *, limit: int | None = None) -> list[ReceiverRun]:
        """Deliver what is ready now, without moving the clock (at most ``limit`` messages)."""
        first = len(self.runs)
        if limit is None:
            self._deliver_ready(MAX_DELIVERIES)
        else:
            self._deliver_ready(limit, strict=False)
        return self.runs[first:]

    def _deliver_ready(self, budget: int, *, strict: bool = True) -> None:
        """Deliver ready messages, one per consumed queue in turn, at most ``budget``; with
        ``strict``, a budget spent while messages are still ready is an error."""
        policy_cache.invalidate()  # RetryPolicy rows written by the test apply at once
        delivered = 0
        while True:
            self._relay_outbox()
            self._return_given_back()
            self.breakers.tick(self.now)
            ready = [
                q
                for q, receiver in self._by_queue.items()
                if self.model.has_ready(q) and self.breakers.consumed(receiver)
            ]
            if not ready:
                return
            for queue in ready:
                if delivered >= budget:
                    if strict:
                        raise RuntimeError(
                            f"still not idle after {delivered} deliveries; last runs: "
                            f"{self.runs[-3:]}"
                        )
                    return
                stored = self.model.take(queue)
                if stored is not None:
                    self._deliver(queue, self._by_queue[queue], stored)
                    delivered += 1

    def _waiting_for_breaker(self) -> bool:
        """Whether messages wait in a queue not consumed while its breaker is open."""
        return any(
            self.model.has_ready(q) and not self.breakers.consumed(r)
            for q, r in self._by_queue.items()
        )

    def _return_given_back(self) -> None:
        """Gates' give-backs whose wait is over go back to the head of their queue."""
        if not self._given_back:
            return
        now = self.model.now_ms
        due = [g for g in self._given_back if g[0] <= now]
        self._given_back = [g for g in self._given_back if g[0] > now]
        for _at, queue, stored in reversed(due):  # the first given back ends up first
            self.model.give_back(queue, stored)

    def _relay_outbox(self) -> None:
        """Publish the outbox rows the test committed (or wrote in its test transaction),
        as the relay of ``rmq_consume`` would; only once this process wrote any."""
        if rows_written.is_set():
            publish_all(publisher=self.publisher)

    def _deliver(self, queue: str, receiver: Receiver | None, stored: Stored) -> None:
        delivery = Delivery(
            queue,
            receiver,
            stored.exchange,
            stored.routing_key,
            stored.redelivered,
            stored.properties,
            stored.body,
        )
        with _after_commit_callbacks():
            action = self.handler.handle(delivery)
            outcome = self._settle(delivery, stored, action)
        self._record(delivery, action, outcome)

    def _settle(self, d: Delivery, stored: Stored, action: Action) -> str:
        """Carry out ``action`` as the real consumer's loop does; returns the outcome."""
        if isinstance(action, Ack):
            self._limits.forget([action.start_key])  # settled: stop counting its give-backs
            return "set_aside" if action.kind == "held" else "handled"
        if isinstance(action, PublishRetry):
            if self.model.publish(
                action.exchange, action.routing_key, action.body, action.properties
            ):
                self._limits.forget([action.start_key])
                action.announce()  # the "confirm": the copy is stored, ack the original
                return "held" if isinstance(action, PublishHold) else "retried"
        elif isinstance(action, StorePark):
            job = ParkJob(d, action.request, action.start_key, action.log_line)
            if commit([job], self.names, self._limits.forget)[0]:
                return "parked"
        elif isinstance(action, RetryInPlace) and d.receiver is not None:
            # The quorum-native engine: the queue counts the give-back and holds it.
            headers = dict(stored.properties.get("headers") or {})
            headers[DELIVERY_COUNT] = count = delivery_count(headers) + 1
            stored.properties = {**stored.properties, "headers": headers}
            wait_ms = native_retry(code_policy(d.receiver)).delay_ms(count)
            self._limits.forget([action.start_key])
            self._given_back.append((self.model.now_ms + max(1, wait_ms), d.queue, stored))
            action.announce()
            return "retried"
        else:
            assert isinstance(action, Release)
            if not action.counted:  # a gate's give-back: back after its wait, uncounted
                self._limits.forget([action.start_key])
                due = self.model.now_ms + max(1, round(action.wait * 1000))
                self._given_back.append((due, d.queue, stored))
                return "given_back"
        self.model.give_back(d.queue, stored)  # the copy or the row did not make it
        return "released"

    def _record(self, d: Delivery, action: Action, outcome: str) -> None:
        headers = d.properties.get("headers")
        envelope = read_incoming(headers, d.exchange, d.routing_key, self.names)
        run_attempt = envelope.attempt
        if self.handler.native_retry:  # the queue counts the attempts given back to it
            run_attempt = native_attempt(run_attempt, headers or {}, MAX_ATTEMPT)
        delay = None
        if isinstance(action, PublishRetry | RetryInPlace) and outcome == "retried":
            delay = action.signal_kwargs.get("delay")
        reason = action.request.reason if isinstance(action, StorePark) else None
        self.runs.append(
            ReceiverRun(
                receiver=d.receiver.name if d.receiver else "",
                message_id=d.properties.get("message_id"),
                attempt=run_attempt,
                outcome=outcome,
                at=self.elapsed,
                delay=delay,
                reason=reason,
            )
        )

    # Looking ------------------------------------------------------------------------------
    def runs_of(self, receiver: Receiver | Callable[..., Any] | str) -> list[ReceiverRun]:
        """The runs of one receiver (give the function, its ``Receiver`` or its dotted path)."""
        name = _receiver_name(receiver)
        return [r for r in self.runs if r.receiver == name]

    def sent_to(self, topic: Any) -> list[Any]:
        """Decoded bodies published to ``topic`` (a ``Topic`` or a routing key), in order."""
        key = getattr(topic, "routing_key", topic)
        return [m.body for m in self.sent if m.routing_key == key]

    def depth(self, queue: str) -> int:
        """Messages waiting in a queue (a full name, or a receiver's dotted path). An ordered
        receiver's count is the sum over its partition queues (name one for its own)."""
        return sum(self.model.depth(name) for name in self._queue_names(queue))

    def waiting(self) -> Iterator[tuple[str, Stored]]:
        """(queue, message) for every message anywhere, delay levels included."""
        return self.model.messages()

    def delete_queue(self, queue: str) -> int:
        """Delete a queue, as an operator might (a retry due for it then ends orphaned);
        a receiver's name deletes each of an ordered receiver's partition queues."""
        deleted = 0
        for name in self._queue_names(queue):
            self._by_queue.pop(name, None)
            deleted += self.model.delete_queue(name)
        return deleted

    def _queue_names(self, queue: str) -> list[str]:
        """The queues ``queue`` names: itself if the model has it, else those a receiver
        (by dotted path or queue name) is consumed from."""
        if queue in self.model.queues:
            return [queue]
        rec = default_registry.find(queue, self.names.prefix)
        if rec is None:
            return [queue]
        return receiver_queues(rec, self.names.prefix, ordering_partitions())

    def _sent(self, exchange: str, routing_key: str, body: bytes, props: Mapping[str, Any]) -> bool:
        """Publish into the model, remembering what went to the work exchange."""
        routed = self.model.publish(exchange, routing_key, body, props)
        if exchange == self.names.work_exchange:
            try:
                decoded = decode_body(
                    body, props.get("content_type"), props.get("content_encoding")
                )
            except Undecodable:
                decoded = body
            self.sent.append(SentMessage(routing_key, decoded, body, dict(props)))
        return routed


class _MemoryPublisher(Publisher):
    """The process publisher while an :class:`InMemoryBroker` runs: same encoding, same
    errors (an unroutable message raises), its messages go to the model."""

    def __init__(self, broker: InMemoryBroker) -> None:
        super().__init__(declare=False)
        self._broker = broker

    def _send_batch(self, items: list[Any], window: int) -> None:
        for item in items:
            item.returned = not self._broker._sent(
                item.exchange, item.routing_key, item.body, item.properties
            )
            item.state = "ack"

    def _send_stream(
        self, items: Iterable[Any], window: int, sent: list[Any] | None = None
    ) -> None:
        for item in items:  # each answered at once: a lazy source may wait for answers
            if item is not None:  # None: "nothing yet" (see Publisher.stream_items)
                self._send_batch([item], window)
                if sent is not None:
                    sent.append(item)

    def close(self) -> None:
        """Nothing to close: there is no connection."""


@contextlib.contextmanager
def _after_commit_callbacks() -> Iterator[None]:
    """Run ``on_commit`` callbacks at the end of a delivery even inside a test transaction.

    Outside a transaction (autocommit, ``TransactionTestCase``) they already run at once.
    """
    if transaction.get_connection().in_atomic_block:
        with TestCase.captureOnCommitCallbacks(execute=True):
            yield
    else:
        yield


def _receiver_name(receiver: Receiver | Callable[..., Any] | str) -> str:
    if isinstance(receiver, str):
        rec = default_registry.find(receiver, current_names().prefix)
        return rec.name if rec else receiver
    if isinstance(receiver, Receiver):
        return receiver.name
    for rec in default_registry.all():
        if rec.func is receiver:
            return rec.name
    raise LookupError(f"{receiver!r} is not a registered receiver")


__all__ = ["InMemoryBroker", "ReceiverRun", "SentMessage"]
