"""``Topic``: a named event users send and receivers subscribe to.

A topic is a routing key on the work exchange (the registry's :class:`TopicKey`) plus the
ways to publish to it. ``@receiver(topic)`` (``registry.receiver``) subscribes a function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction

from . import hooks as _hooks
from .conf import app_settings
from .core.backoff import Policy
from .publishing.per_thread import get_publisher
from .publishing.publisher import PublishResult, encode_body
from .registry import (
    OrderingKey,
    Receiver,
    ReceiverFunc,
    Registry,
    TopicKey,
    default_registry,
)
from .schemas.sending import encode_typed, typed_adapter
from .schemas.upcasting import HEADER as VERSION_HEADER


class Topic(TopicKey):
    """A named event published to the work exchange under ``routing_key``.

    ``outbox`` chooses how ``send`` publishes for this topic: ``True`` writes an outbox row
    in the current database transaction (published by the relay once it commits), ``False``
    publishes at once, ``None`` (default) follows the ``OUTBOX`` setting.

    ``schema`` (a ``msgspec.Struct``, a pydantic ``BaseModel`` or a ``@dataclass``) makes
    the topic typed: ``send`` validates a dict before anything is published (raising
    ``ValidationError``) and encodes an instance with its library; receivers get an
    instance as ``message.data``, and a body that does not fit is parked at once as
    *invalid*. ``schema_version`` goes out in the ``schema_version`` header
    (``schemas.upcasting``: older bodies are upcast before validation).
    """

    def __init__(
        self,
        routing_key: str,
        *,
        description: str = "",
        outbox: bool | None = None,
        schema: type | None = None,
        schema_version: int = 1,
    ) -> None:
        super().__init__(routing_key, description=description)
        self.outbox = outbox
        self.schema = schema
        self.schema_version = schema_version
        self._adapter = typed_adapter(routing_key, schema, schema_version)

    def uses_outbox(self, outbox: bool | None = None) -> bool:
        """Whether a send goes through the outbox: the call's choice, the topic's, the setting."""
        for choice in (outbox, self.outbox):
            if choice is not None:
                return bool(choice)
        return bool(app_settings.OUTBOX)

    # Publishing -------------------------------------------------------------------------
    def send(
        self,
        body: Any,
        *,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        outbox: bool | None = None,
        using: str | None = None,
        **properties: Any,
    ) -> PublishResult:
        """Publish and wait for the broker's confirm (raises ``PublishError`` if not), or,
        through the outbox, write the message in the current transaction of database
        ``using`` (default: where the outbox table lives) and return at once."""
        hooks = _hooks.current
        if hooks is not None:  # observability: a trace context into the headers, counts
            headers = dict(headers or {})
            out = _hooks.SendEvent(
                self.routing_key, headers, self.uses_outbox(outbox), properties=properties
            )
            with hooks.sending(out):
                return self._send(body, headers, content_type, outbox, using, properties)
        return self._send(body, headers, content_type, outbox, using, properties)

    def _send(
        self,
        body: Any,
        headers: Mapping[str, Any] | None,
        content_type: str | None,
        outbox: bool | None,
        using: str | None,
        properties: dict[str, Any],
    ) -> PublishResult:
        if self._adapter is not None:
            body, content_type, headers = self._typed(body, content_type, headers)
        if self.uses_outbox(outbox):
            return _outbox().enqueue(
                self.routing_key,
                body,
                headers=headers,
                content_type=content_type,
                using=using,
                **properties,
            )
        return get_publisher().send_bodies(
            self.routing_key, [body], headers=headers, content_type=content_type, **properties
        )[0]

    def send_many(
        self,
        bodies: Iterable[Any],
        *,
        outbox: bool | None = None,
        using: str | None = None,
        **kwargs: Any,
    ) -> list[PublishResult]:
        """Publish several messages with one round of confirms (much faster than a loop);
        through the outbox, one multi-row INSERT in the current transaction."""
        hooks = _hooks.current
        if hooks is not None:  # observability: one trace context for the batch, counts
            bodies = list(bodies)
            headers = kwargs["headers"] = dict(kwargs.get("headers") or {})
            out = _hooks.SendEvent(
                self.routing_key, headers, self.uses_outbox(outbox), count=len(bodies)
            )
            with hooks.sending(out):
                return self._send_many(bodies, outbox, using, kwargs)
        return self._send_many(bodies, outbox, using, kwargs)

    def _send_many(
        self, bodies: Iterable[Any], outbox: bool | None, using: str | None, kwargs: dict[str, Any]
    ) -> list[PublishResult]:
        if self._adapter is not None:  # every body validated before any is published
            typed = [
                self._typed(b, kwargs.get("content_type"), kwargs.get("headers")) for b in bodies
            ]
            bodies = [b for b, _c, _h in typed]
            if typed:
                kwargs = {**kwargs, "content_type": typed[0][1], "headers": typed[0][2]}
        if self.uses_outbox(outbox):
            return _outbox().enqueue_many(self.routing_key, bodies, using=using, **kwargs)
        return get_publisher().send_bodies(self.routing_key, bodies, **kwargs)

    def send_on_commit(self, body: Any, *, using: str | None = None, **kwargs: Any) -> None:
        """Publish once the current database transaction commits (now if there is none).

        Between that commit and the broker's confirm the message can be lost (the process
        dies, the broker is down); the outbox (``outbox=True``) closes that gap, and with it
        this is the same as ``send``: the row already waits for the commit.

        The body is encoded now, as ``send`` does: one that is not JSON serialisable raises
        ``TypeError`` at this call, in the caller's transaction, not after its commit.
        """
        if self.uses_outbox(kwargs.pop("outbox", None)):
            self.send(body, outbox=True, using=using, **kwargs)
            return
        if self._adapter is not None:  # an invalid body raises here, not after the commit
            body, kwargs["content_type"], kwargs["headers"] = self._typed(
                body, kwargs.get("content_type"), kwargs.get("headers")
            )
        data, content_type = encode_body(body, kwargs.pop("content_type", None))
        transaction.on_commit(
            lambda: self.send(data, content_type=content_type, **kwargs), using=using, robust=False
        )

    def _typed(
        self, body: Any, content_type: str | None, headers: Mapping[str, Any] | None
    ) -> tuple[bytes, str, dict[str, Any]]:
        """A typed topic's body validated and encoded (``schemas``), with its version."""
        assert self._adapter is not None
        data = encode_typed(self._adapter, body, content_type)
        return data, "application/json", {**(headers or {}), VERSION_HEADER: self.schema_version}

    # Receivers --------------------------------------------------------------------------
    def connect(
        self,
        func: ReceiverFunc,
        *,
        queue: str | None = None,
        ordering_key: OrderingKey | None = None,
        retry: Policy | Mapping[str, Any] | None = None,
        idempotent: bool = False,
        registry: Registry | None = None,
    ) -> ReceiverFunc:
        """Subscribe ``func`` to this topic: ``@receiver(topic, ...)`` without a decorator,
        for receivers made at run time (a closure, a function from another module).

        ``ordering_key`` (a body field, or ``callable(message) -> str``) keeps per-key order
        as it does for ``@receiver`` (docs/howto/ordering.md); connecting the same function
        again adds this topic to the receiver it already is.
        """
        (registry if registry is not None else default_registry).register(
            func,
            [self],
            queue=queue,
            ordering_key=ordering_key,
            retry=retry,
            idempotent=idempotent,
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


def _outbox() -> Any:
    """The ``outbox`` package, imported on first use: it needs the models, and topics are
    created while the app registry is still loading (``import django_rmq_retry``)."""
    from . import outbox

    return outbox
