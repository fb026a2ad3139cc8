"""An AMQP 0-9-1 broker in memory, as much of one as our topology uses, on a virtual clock.

Exchanges (direct, topic, fanout, headers) with queue and exchange-to-exchange bindings and
alternate exchanges; durable-looking queues with a per-queue TTL (``x-message-ttl``) and a
dead-letter exchange, and per-message ``expiration``. Expiry happens only at the head of a
queue, as in RabbitMQ, and a dead-lettered message carries an ``x-death`` record. Time is a
number of milliseconds that moves only when :meth:`MemoryBroker.advance_to` is called, so
the delay cascade of a week runs in microseconds.

What it does not model (nothing here needs it): acks and prefetch windows (a consumer takes a
message off the queue and puts it back with :meth:`MemoryBroker.give_back`), priorities,
queue length limits, other exchange types.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..core.errors import ChannelClosed
from ..core.topology_plan import Plan


@dataclass
class Stored:
    """A message in a queue."""

    exchange: str
    routing_key: str
    properties: dict[str, Any]
    body: bytes
    enqueued_ms: int = 0
    redelivered: bool = False

    def expires_ms(self, queue_ttl: int | None) -> int | None:
        ttls = [queue_ttl] if queue_ttl is not None else []
        expiration = self.properties.get("expiration")
        if expiration is not None and str(expiration).isdigit():
            ttls.append(int(expiration))
        return self.enqueued_ms + min(ttls) if ttls else None


@dataclass
class Binding:
    destination: str
    to_queue: bool  # a queue binding, or an exchange-to-exchange one
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Exchange:
    name: str
    kind: str
    arguments: dict[str, Any]
    bindings: list[Binding] = field(default_factory=list)


@dataclass
class Queue:
    name: str
    arguments: dict[str, Any]
    messages: deque[Stored] = field(default_factory=deque)

    @property
    def ttl(self) -> int | None:
        value = self.arguments.get("x-message-ttl")
        return int(value) if value is not None else None

    def head_expires_ms(self) -> int | None:
        return self.messages[0].expires_ms(self.ttl) if self.messages else None


class MemoryBroker:
    """Exchanges, queues and a virtual clock (see the module docstring)."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = start_ms
        self.exchanges: dict[str, Exchange] = {"": Exchange("", "direct", {})}
        self.queues: dict[str, Queue] = {}

    # Topology ------------------------------------------------------------------------------
    def declare(self, plan: Plan) -> None:
        """Declare a topology plan; like the real broker, declaring twice changes nothing."""
        for name, kind, arguments in plan.exchanges:
            self.exchanges.setdefault(name, Exchange(name, kind, dict(arguments)))
        for destination, source, key in plan.exchange_bindings:
            self._bind(source, Binding(destination, False, key))
        for spec in plan.queues:
            self.queues.setdefault(spec.name, Queue(spec.name, dict(spec.arguments)))
            for b in spec.bindings:
                self._bind(
                    b.source, Binding(spec.name, True, b.routing_key, dict(b.arguments or {}))
                )

    def _bind(self, source: str, binding: Binding) -> None:
        bindings = self._exchange(source).bindings
        if binding not in bindings:
            bindings.append(binding)

    def delete_queue(self, name: str) -> int:
        """Delete a queue and its bindings; returns the messages it held (now gone)."""
        queue = self.queues.pop(name, None)
        for exchange in self.exchanges.values():
            exchange.bindings = [
                b for b in exchange.bindings if not (b.to_queue and b.destination == name)
            ]
        return len(queue.messages) if queue else 0

    def _exchange(self, name: str) -> Exchange:
        try:
            return self.exchanges[name]
        except KeyError:
            raise ChannelClosed(404, f"NOT_FOUND - no exchange '{name}' in vhost '/'") from None

    # Publishing ----------------------------------------------------------------------------
    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: Mapping[str, Any]
    ) -> bool:
        """Route a message; ``False`` if no queue took it (a mandatory publish is returned).

        A missing exchange closes the channel, as on the real broker (``ChannelClosed``).
        """
        queues = self.route(exchange, routing_key, properties.get("headers") or {})
        for name in queues:
            self.queues[name].messages.append(
                Stored(exchange, routing_key, _copy(properties), bytes(body), self.now_ms)
            )
        return bool(queues)

    def route(self, exchange: str, routing_key: str, headers: Mapping[str, Any]) -> list[str]:
        """The queues a message published to ``exchange`` lands in (each once)."""
        found: dict[str, None] = {}
        self._route(self._exchange(exchange), routing_key, headers, found, set())
        return list(found)

    def _route(
        self,
        exchange: Exchange,
        routing_key: str,
        headers: Mapping[str, Any],
        found: dict[str, None],
        seen: set[str],
    ) -> None:
        if exchange.name in seen:
            return
        seen.add(exchange.name)
        if exchange.name == "":
            if routing_key in self.queues:
                found[routing_key] = None
            return
        matched = [b for b in exchange.bindings if _matches(exchange.kind, b, routing_key, headers)]
        before = len(found)
        for b in matched:
            if b.to_queue:
                if b.destination in self.queues:
                    found[b.destination] = None
            elif b.destination in self.exchanges:
                self._route(self.exchanges[b.destination], routing_key, headers, found, seen)
        alternate = exchange.arguments.get("alternate-exchange")
        if len(found) == before and alternate in self.exchanges:
            self._route(self.exchanges[alternate], routing_key, headers, found, seen)

    # Consuming -----------------------------------------------------------------------------
    def take(self, queue: str) -> Stored | None:
        """The head of ``queue`` if it holds a live message (expired ones are dead-lettered)."""
        self.expire()
        q = self.queues.get(queue)
        return q.messages.popleft() if q and q.messages else None

    def has_ready(self, queue: str) -> bool:
        """Whether :meth:`take` would return a message now."""
        self.expire()
        return bool(self.depth(queue))

    def give_back(self, queue: str, message: Stored) -> None:
        """Return a taken message to the head of its queue, marked redelivered (a nack)."""
        message.redelivered = True
        q = self.queues.get(queue)
        if q is not None:
            q.messages.appendleft(message)

    def depth(self, queue: str) -> int:
        q = self.queues.get(queue)
        return len(q.messages) if q else 0

    def messages(self) -> Iterator[tuple[str, Stored]]:
        for q in self.queues.values():
            for m in q.messages:
                yield q.name, m

    # Time ----------------------------------------------------------------------------------
    def next_expiry_ms(self) -> int | None:
        """When the next head of a queue expires (``None``: nothing waits on a TTL)."""
        due = [t for t in (q.head_expires_ms() for q in self.queues.values()) if t is not None]
        return min(due) if due else None

    def advance_to(self, ms: int) -> None:
        """Move the clock forward to ``ms`` (never back), expiring what is due on the way."""
        while True:
            due = self.next_expiry_ms()
            if due is None or due > ms:
                break
            self.now_ms = max(self.now_ms, due)
            self.expire()
        self.now_ms = max(self.now_ms, ms)

    def expire(self) -> None:
        """Dead-letter (or drop) every queue head whose time has come, until none is due."""
        moved = True
        while moved:
            moved = False
            for q in list(self.queues.values()):
                while q.messages:
                    expires = q.head_expires_ms()
                    if expires is None or expires > self.now_ms:
                        break
                    self._dead_letter(q, q.messages.popleft())
                    moved = True

    def _dead_letter(self, queue: Queue, message: Stored) -> None:
        target = queue.arguments.get("x-dead-letter-exchange")
        if target is None or target not in self.exchanges:
            return  # dropped, as RabbitMQ drops an expired message with nowhere to go
        key = queue.arguments.get("x-dead-letter-routing-key") or message.routing_key
        props = _copy(message.properties)
        props["expiration"] = None  # RabbitMQ removes it so the message does not expire again
        props["headers"] = _with_death(props.get("headers") or {}, queue.name, message, self.now_ms)
        self.publish(target, key, message.body, props)


# Routing ---------------------------------------------------------------------------------------
def _matches(kind: str, b: Binding, routing_key: str, headers: Mapping[str, Any]) -> bool:
    if kind == "fanout":
        return True
    if kind == "direct":
        return b.routing_key == routing_key
    if kind == "topic":
        return topic_matches(b.routing_key, routing_key)
    if kind == "headers":
        return _headers_match(b.arguments, headers)
    raise ValueError(f"exchange type {kind!r} is not modelled")


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: words split on '.', '*' is one word, '#' zero or more.

    As in RabbitMQ, an empty key has no words (so ``*`` does not match it, ``#`` does).
    """
    return _words_match(_words(pattern), _words(routing_key))


def _words(key: str) -> list[str]:
    return key.split(".") if key else []


def _words_match(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_words_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _words_match(rest, words[1:])


def _headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    wanted = {k: v for k, v in arguments.items() if not k.startswith("x-")}
    mode = arguments.get("x-match", "all")
    hits = [k in headers and (v is None or headers[k] == v) for k, v in wanted.items()]
    return any(hits) if mode in ("any", "any-with-x") else all(hits)


def _copy(properties: Mapping[str, Any]) -> dict[str, Any]:
    props = dict(properties)
    props["headers"] = dict(props.get("headers") or {})
    return props


def _with_death(
    headers: Mapping[str, Any], queue: str, message: Stored, now_ms: int
) -> dict[str, Any]:
    """Headers plus RabbitMQ's record of this dead-lettering (``x-death`` and friends)."""
    out = dict(headers)
    deaths: list[Any] = [dict(d) for d in out.get("x-death") or [] if isinstance(d, Mapping)]
    for death in deaths:
        if death.get("queue") == queue and death.get("reason") == "expired":
            death["count"] = int(death.get("count", 0)) + 1
            deaths.remove(death)
            deaths.insert(0, death)
            break
    else:
        deaths.insert(
            0,
            {
                "count": 1,
                "reason": "expired",
                "queue": queue,
                "time": datetime.fromtimestamp(now_ms // 1000, tz=timezone.utc),
                "exchange": message.exchange,
                "routing-keys": [message.routing_key],
            },
        )
    out["x-death"] = deaths
    out.setdefault("x-first-death-exchange", message.exchange)
    out.setdefault("x-first-death-queue", queue)
    out.setdefault("x-first-death-reason", "expired")
    return out
