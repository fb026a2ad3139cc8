"""Receivers and the registry: the signal-like declarations users write.

Each receiver function owns one durable queue bound to its topics' routing keys, so two
receivers of one topic each get a copy and a failing one never makes its sibling run twice.
Receivers are held by strong references (Django's ``Signal.connect`` is weak by default: a
closure registered there silently vanishes).
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from ..core.backoff import Policy
from ..core.message import Message
from ..core.ordering import OrderingKeyError, check_key, key_from_body
from ..schemas import adapter_for, is_schema

ReceiverFunc = Callable[..., Any]
#: ``ordering_key=``: a body field (``"account_id"``, ``"a.b"``) or ``callable(message) -> str``.
OrderingKey = str | Callable[[Message], Any]
_ROUTING_KEY = re.compile(r"^[^\s#*]{1,255}$")
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


class TopicKey:
    """What the registry knows of a topic: its routing key on the work exchange.

    :class:`django_rmq_retry.Topic` adds sending; receivers only ever need the key.
    """

    def __init__(self, routing_key: str, *, description: str = "") -> None:
        if not isinstance(routing_key, str) or not _ROUTING_KEY.match(routing_key):
            raise ImproperlyConfigured(
                f"Topic routing key {routing_key!r} must be 1-255 characters, "
                "no spaces and no '*' or '#' (topics are exact keys, not patterns)."
            )
        self.routing_key = routing_key
        self.description = description

    def __repr__(self) -> str:
        return f"Topic({self.routing_key!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TopicKey) and other.routing_key == self.routing_key

    def __hash__(self) -> int:
        return hash(("Topic", self.routing_key))


@dataclass
class Receiver:
    """A receiver function, its queue and its retry policy as declared in code."""

    func: ReceiverFunc
    name: str  # dotted path, e.g. "billing.consumers.send_invoice"
    queue_suffix: str | None  # explicit queue name given by the user (prefix added later)
    topics: list[TopicKey] = field(default_factory=list)
    policy: Policy | None = None
    #: Run in a database transaction with an inbox row: a redelivery of a message whose
    #: transaction committed is acked without running again (``consumer.inbox``).
    idempotent: bool = False
    #: RabbitMQ priorities of the queue (``x-max-priority``; 0: none). Tasks use it; the
    #: argument is declared on classic queues only (``core.topology_plan``).
    max_priority: int = 0
    #: Per-key order (``core.ordering``): the body field or callable giving each message's
    #: key. ``None``: unordered (one queue, messages run as they come).
    ordering_key: OrderingKey | None = None
    #: The dependencies it calls (``RMQ_RETRY["DEPENDENCIES"]`` names): while one's breaker
    #: is open this receiver's queue is not consumed.
    depends_on: tuple[str, ...] = ()
    #: The receiver's own schema (``schemas``); ``None``: its topic's, if the topic has one.
    schema: type | None = None

    @property
    def routing_keys(self) -> list[str]:
        return [t.routing_key for t in self.topics]

    def queue_name(self, prefix: str) -> str:
        return f"{prefix}.{self.queue_suffix or self.name}"

    def topic_for(self, routing_key: str) -> TopicKey | None:
        return next((t for t in self.topics if t.routing_key == routing_key), None)

    def key_of(self, message: Message) -> str:
        """The ordering key of ``message`` (an ordered receiver's); ``OrderingKeyError``
        says why there is none. The publisher and the consumer both call this on the body
        decoded from the same bytes, so both find the same key."""
        spec = self.ordering_key
        if spec is None:
            raise OrderingKeyError(f"receiver {self.name} has no ordering_key")
        if isinstance(spec, str):
            return key_from_body(message.body, spec)
        try:
            value = spec(message)
        except Exception as exc:  # the user's callable: a bad message, said readably
            raise OrderingKeyError(
                f"the ordering_key callable of {self.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        return check_key(value, f"ordering_key of {self.name}")


def dotted_path(func: ReceiverFunc) -> str:
    module = getattr(func, "__module__", None) or "unknown"
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    return f"{module}.{qualname}".replace(".<locals>.", ".")


def _check_signature(func: ReceiverFunc, name: str) -> None:
    if not callable(func):
        raise ImproperlyConfigured(f"Receiver {name} is not callable.")
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return
    if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        raise ImproperlyConfigured(
            f"Receiver {name} must accept **kwargs (like Django signal receivers), "
            f"e.g. def {getattr(func, '__name__', 'handler')}(message, **kwargs): ..."
        )


def _policy(retry: Policy | Mapping[str, Any] | None, name: str) -> Policy | None:
    if retry is None or isinstance(retry, Policy):
        return retry
    if isinstance(retry, Mapping):
        try:
            return Policy.from_mapping(retry)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"Receiver {name}: bad retry policy: {exc}") from exc
    raise ImproperlyConfigured(f"Receiver {name}: retry= must be a Policy or a dict.")


class Registry:
    """Receivers by name, held by strong references (a closure never silently vanishes)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Receiver] = {}
        self._lock = threading.RLock()

    def register(
        self,
        func: ReceiverFunc,
        topics: Iterable[TopicKey],
        *,
        queue: str | None = None,
        ordering_key: OrderingKey | None = None,
        retry: Policy | Mapping[str, Any] | None = None,
        idempotent: bool = False,
        depends_on: str | Iterable[str] = (),
        schema: type | None = None,
    ) -> Receiver:
        topics = list(topics)
        name = dotted_path(func)
        needs = _dependency_names(depends_on, name)
        if not topics or not all(isinstance(t, TopicKey) for t in topics):
            raise ImproperlyConfigured(f"Receiver {name}: give one or more Topic objects.")
        if queue is not None and not _QUEUE_NAME.match(queue):
            raise ImproperlyConfigured(
                f"Receiver {name}: queue name {queue!r} may only use letters, digits, "
                "'_', '.', ':' and '-' (at most 200 characters)."
            )
        _check_signature(func, name)
        if idempotent and inspect.iscoroutinefunction(func):
            raise ImproperlyConfigured(
                f"Receiver {name}: an async def receiver cannot be idempotent=True (the inbox "
                "row and its effects share one transaction, and transactions do not work in "
                "async code); make it a plain def, or keep its database work in one "
                "sync_to_async(transaction.atomic(...)) function of its own."
            )
        policy = _policy(retry, name)
        _check_ordering_key(ordering_key, name)
        if schema is not None:
            _check_schema(schema, name)
        with self._lock:
            existing = self._by_name.get(name)
            if existing is not None:
                if existing.func is not func and _unwrap(existing.func) is not _unwrap(func):
                    raise ImproperlyConfigured(
                        f"Two different receivers are both named {name}; give one of them "
                        "an explicit queue=... or rename it."
                    )
                if queue is not None and existing.queue_suffix not in (None, queue):
                    raise ImproperlyConfigured(f"Receiver {name} registered with two queues.")
                for t in topics:
                    if t not in existing.topics:
                        existing.topics.append(t)
                if ordering_key is not None:
                    existing.ordering_key = ordering_key
                existing.policy = policy or existing.policy
                existing.idempotent = existing.idempotent or idempotent
                existing.depends_on = tuple(dict.fromkeys((*existing.depends_on, *needs)))
                existing.schema = schema or existing.schema
                return existing
            suffix = queue
            for other in self._by_name.values():
                if (other.queue_suffix or other.name) == (suffix or name):
                    raise ImproperlyConfigured(
                        f"Receivers {other.name} and {name} would share the queue "
                        f"{suffix or name!r}; each receiver needs its own queue."
                    )
            rec = Receiver(
                func=func,
                name=name,
                queue_suffix=suffix,
                topics=topics,
                policy=policy,
                ordering_key=ordering_key,
                idempotent=idempotent,
                depends_on=needs,
                schema=schema,
            )
            self._by_name[name] = rec
            return rec

    def unregister(self, func: ReceiverFunc, topic: TopicKey | None = None) -> bool:
        name = dotted_path(func)
        with self._lock:
            rec = self._by_name.get(name)
            if rec is None:
                return False
            if topic is None:
                del self._by_name[name]
                return True
            if topic not in rec.topics:
                return False
            rec.topics.remove(topic)
            if not rec.topics:
                del self._by_name[name]
            return True

    def all(self) -> list[Receiver]:
        with self._lock:
            return sorted(self._by_name.values(), key=lambda r: r.name)

    def get(self, name: str) -> Receiver | None:
        return self._by_name.get(name)

    def find(self, name_or_queue: str, prefix: str) -> Receiver | None:
        """Look a receiver up by dotted path, queue name, or a unique trailing part of either."""
        exact = self._by_name.get(name_or_queue)
        if exact:
            return exact
        by_queue = [
            r for r in self.all() if name_or_queue in (r.queue_suffix, r.queue_name(prefix))
        ]
        if len(by_queue) == 1:
            return by_queue[0]
        candidates = [
            r
            for r in self.all()
            if r.queue_name(prefix) == name_or_queue
            or r.queue_suffix == name_or_queue
            or r.name.endswith("." + name_or_queue)
            or r.name.split(".")[-1] == name_or_queue
        ]
        return candidates[0] if len(candidates) == 1 else None

    def unrouted_hint(self, routing_key: str, discover_module: str) -> str:
        """What to check when the broker had no queue for ``routing_key`` (a send came back
        unroutable): the receivers this process knows, and where receivers come from."""
        missing = app_missing_hint()
        if missing:
            return missing
        mine = [r.name for r in self.all() if routing_key in r.routing_keys]
        if mine:
            return (
                f"This process knows the receiver(s) of {routing_key!r} ({', '.join(mine)}), "
                "but their queue is not on the broker: run `manage.py rmq_setup` (or start "
                "`manage.py rmq_consume`) against this broker and prefix."
            )
        everyone = [f"{r.name} <- {', '.join(r.routing_keys)}" for r in self.all()]
        known = "; ".join(everyone[:10]) + ("; ..." if len(everyone) > 10 else "")
        return (
            f"No receiver of {routing_key!r} is registered in this process (receivers "
            f"known: {known or 'none'}). Check that the app defining it is in "
            f"INSTALLED_APPS and that its @receiver functions are in its "
            f"'{discover_module}.py' module (RMQ_RETRY['DISCOVER_MODULE']), or that the "
            "consumer deployed elsewhere has declared its queue."
        )

    def reset(self) -> None:
        """Forget every receiver (for tests)."""
        with self._lock:
            self._by_name.clear()

    def __len__(self) -> int:
        return len(self._by_name)


def app_missing_hint() -> str:
    """The one thing to say when this app is not in INSTALLED_APPS: no receiver is
    discovered, and the commands a hint would name (``rmq_setup``, ``rmq_consume``) are
    unknown to ``manage.py`` until it is."""
    if apps.is_installed("django_rmq_retry"):
        return ""
    return (
        "'django_rmq_retry' is not in INSTALLED_APPS: add it, then run `manage.py migrate "
        "django_rmq_retry` and `manage.py rmq_setup` (no receiver is discovered, and its "
        "commands do not exist, until it is installed)."
    )


def _dependency_names(depends_on: str | Iterable[str], name: str) -> tuple[str, ...]:
    """``depends_on=`` as a tuple of names (a name or a list of names)."""
    needs = [depends_on] if isinstance(depends_on, str) else list(depends_on or ())
    if not all(isinstance(n, str) and n for n in needs):
        raise ImproperlyConfigured(
            f"Receiver {name}: depends_on= must be a dependency name or a list of names "
            f'(keys of RMQ_RETRY["DEPENDENCIES"]), got {depends_on!r}.'
        )
    return tuple(dict.fromkeys(needs))


def _check_schema(schema: Any, name: str) -> None:
    if not is_schema(schema):
        raise ImproperlyConfigured(
            f"Receiver {name}: schema={schema!r} must be a msgspec.Struct, a pydantic "
            "BaseModel or a @dataclass class."
        )
    try:
        adapter_for(schema)
    except TypeError as exc:
        raise ImproperlyConfigured(f"Receiver {name}: {exc}") from exc


def _check_ordering_key(ordering_key: Any, name: str) -> None:
    if ordering_key is None or callable(ordering_key):
        return
    if not isinstance(ordering_key, str) or not ordering_key.strip(".") or ".." in ordering_key:
        raise ImproperlyConfigured(
            f"Receiver {name}: ordering_key= must be a body field name (e.g. 'account_id') "
            f"or a callable(message) returning the key, got {ordering_key!r}."
        )


def _unwrap(func: Any) -> Any:
    return inspect.unwrap(func) if callable(func) else func


default_registry = Registry()


def receiver(
    topic: TopicKey | Iterable[TopicKey],
    *,
    queue: str | None = None,
    ordering_key: OrderingKey | None = None,
    retry: Policy | Mapping[str, Any] | None = None,
    idempotent: bool = False,
    depends_on: str | Iterable[str] = (),
    schema: type | None = None,
    registry: Registry | None = None,
) -> Callable[[ReceiverFunc], ReceiverFunc]:
    """Decorator: ``@receiver(order_paid)`` or ``@receiver([a, b], queue=..., retry=...)``.

    ``ordering_key="account_id"`` (a body field, or ``callable(message) -> str``): messages
    of one key run in publish order, a retry holding its key only (docs/howto/ordering.md).

    ``idempotent=True``: the receiver's database effects happen once per message even when
    it is delivered twice (docs/howto/outbox.md). ``depends_on="payments"`` (or a list):
    while that dependency's breaker is open the receiver does not run and the broker keeps
    its messages (docs/howto/dependencies.md). ``schema=OrderPaid``: the receiver gets an
    instance as ``message.data`` (else its topic's schema, if any), and a body that does not
    fit is parked at once as *invalid* (docs/howto/typed-receivers.md).
    """
    topics = [topic] if isinstance(topic, TopicKey) else list(topic)

    def decorator(func: ReceiverFunc) -> ReceiverFunc:
        (registry if registry is not None else default_registry).register(
            func,
            topics,
            queue=queue,
            ordering_key=ordering_key,
            retry=retry,
            idempotent=idempotent,
            depends_on=depends_on,
            schema=schema,
        )
        return func

    return decorator
