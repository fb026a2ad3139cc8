"""``Topic``: a named event users send and receivers subscribe to.

A topic is a routing key on the work exchange (the registry's :class:`TopicKey`) plus the
ways to publish to it. ``@receiver(topic)`` (``registry.receiver``) subscribes a function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction

from .core.backoff import Policy
from .publishing import PublishResult, get_publisher
from .registry import Receiver, ReceiverFunc, Registry, TopicKey, default_registry


class Topic(TopicKey):
    """A named event published to the work exchange under ``routing_key``."""

    # Publishing -------------------------------------------------------------------------
    def send(
        self,
        body: Any,
        *,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        **properties: Any,
    ) -> PublishResult:
        """Publish now and wait for the broker's confirm. Raises ``PublishError`` if not."""
        return get_publisher().publish(
            self.routing_key, body, headers=headers, content_type=content_type, **properties
        )

    def send_many(self, bodies: Iterable[Any], **kwargs: Any) -> list[PublishResult]:
        """Publish several messages with one round of confirms (much faster than a loop)."""
        return get_publisher().publish_many(self.routing_key, bodies, **kwargs)

    def send_on_commit(self, body: Any, *, using: str | None = None, **kwargs: Any) -> None:
        """Publish once the current database transaction commits (now if there is none)."""
        transaction.on_commit(lambda: self.send(body, **kwargs), using=using, robust=False)

    # Receivers --------------------------------------------------------------------------
    def connect(
        self,
        func: ReceiverFunc,
        *,
        queue: str | None = None,
        retry: Policy | Mapping[str, Any] | None = None,
        registry: Registry | None = None,
    ) -> ReceiverFunc:
        (registry if registry is not None else default_registry).register(
            func, [self], queue=queue, retry=retry
        )
        return func

    def disconnect(self, func: ReceiverFunc, *, registry: Registry | None = None) -> bool:
        return (registry if registry is not None else default_registry).unregister(func, self)

    def receivers(self, registry: Registry | None = None) -> list[Receiver]:
        return [
            r
            for r in (registry if registry is not None else default_registry).all()
            if self in r.topics
        ]
