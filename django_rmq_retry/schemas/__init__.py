"""Typed messages: one adapter protocol for msgspec, pydantic v2 and dataclasses.

A topic (``Topic(..., schema=OrderPaid)``) or a receiver (``@receiver(..., schema=...)``)
names a schema: a ``msgspec.Struct``, a pydantic ``BaseModel`` or a ``@dataclass``. Its
:class:`Adapter` validates a decoded JSON body into an instance (``message.data``), encodes
an instance to JSON bytes with its own library (``Decimal`` and datetimes exact), and gives
its JSON Schema (the AsyncAPI document). A body that does not fit raises
``django_rmq_retry.ValidationError`` naming each failing field.

Nothing here imports msgspec or pydantic: a schema class of theirs can only exist once its
library is imported, so :func:`adapter_for` finds the library in ``sys.modules`` and loads
the adapter module that imports it only then. Projects without them never import them.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, Protocol

from ..core.errors import ValidationError
from .upcasting import HEADER, upcast, version_of

__all__ = [
    "Adapter",
    "Plan",
    "ValidationError",
    "adapter_for",
    "is_schema",
    "plan_for",
    "schema_of",
    "target_version",
]


class Adapter(Protocol):
    """What the consumer and ``Topic.send`` need of a schema, whatever its library."""

    schema: type
    #: "msgspec", "pydantic" or "dataclass".
    library: str

    def validate(self, body: Any) -> Any:
        """The instance ``body`` (a decoded JSON value) makes; ``ValidationError`` if none."""

    def is_instance(self, value: Any) -> bool:
        """Whether ``value`` already is an instance (sent as it is, encoded by its library)."""

    def encode(self, instance: Any) -> bytes:
        """An instance as compact JSON bytes (what ``Topic.send`` publishes)."""

    def json_schema(self) -> dict[str, Any]:
        """The schema as JSON Schema (for the AsyncAPI document)."""


_adapters: dict[type, Adapter] = {}
_lock = threading.Lock()


def _library_of(schema: Any) -> str | None:
    if not isinstance(schema, type):
        return None
    msgspec = sys.modules.get("msgspec")
    if msgspec is not None and issubclass(schema, msgspec.Struct):
        return "msgspec"
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(schema, pydantic.BaseModel):
        return "pydantic"
    if dataclasses.is_dataclass(schema):
        return "dataclass"
    return None


def is_schema(schema: Any) -> bool:
    """Whether ``schema`` is a class one of the adapters takes."""
    return _library_of(schema) is not None


def adapter_for(schema: Any) -> Adapter:
    """The adapter of ``schema`` (made once per class); ``TypeError`` if none fits."""
    found = _adapters.get(schema) if isinstance(schema, type) else None
    if found is not None:
        return found
    library = _library_of(schema)
    if library == "msgspec":
        from .msgspec_adapter import MsgspecAdapter as made
    elif library == "pydantic":
        from .pydantic_adapter import PydanticAdapter as made  # type: ignore[assignment]
    elif library == "dataclass":
        from .dataclass_adapter import DataclassAdapter as made  # type: ignore[assignment]
    else:
        raise TypeError(
            f"schema={schema!r} is not a msgspec.Struct, a pydantic BaseModel or a dataclass"
        )
    try:
        adapter = made(schema)
    except (NameError, TypeError) as exc:  # a type hint naming what cannot be found
        raise TypeError(
            f"schema {schema.__qualname__}: its type hints do not resolve ({exc})"
        ) from exc
    with _lock:
        return _adapters.setdefault(schema, adapter)


def schema_of(receiver: Any, routing_key: str) -> Any:
    """The schema a receiver's messages of ``routing_key`` must fit: its own
    (``@receiver(..., schema=)``), else its topic's; ``None``: untyped."""
    own = getattr(receiver, "schema", None)
    if own is not None:
        return own
    return getattr(receiver.topic_for(routing_key), "schema", None)


def target_version(receiver: Any, routing_key: str) -> int:
    """The ``schema_version`` a receiver's messages of ``routing_key`` are validated at."""
    return int(getattr(receiver.topic_for(routing_key), "schema_version", 1))


class Plan:
    """How one receiver's messages of one routing key are validated: made once, then a
    dictionary lookup per message (``consumer.schema_gate`` keeps them)."""

    __slots__ = ("adapter", "routing_key", "target")

    def __init__(self, adapter: Adapter, routing_key: str, target: int) -> None:
        self.adapter = adapter
        self.routing_key = routing_key
        self.target = target

    def validate(self, headers: Any, body: Any) -> Any:
        """``body`` upcast from the version ``headers`` say, then validated."""
        try:
            version = version_of(headers) if headers and HEADER in headers else 1
            if version != self.target:
                body = upcast(self.routing_key, version, self.target, body)
            return self.adapter.validate(body)
        except ValidationError as exc:
            if exc.schema:
                raise
            raise ValidationError(exc.errors, self.adapter.schema.__name__) from None


def plan_for(receiver: Any, routing_key: str) -> Plan | None:
    """The :class:`Plan` of a receiver's messages of ``routing_key`` (``None``: untyped)."""
    schema = schema_of(receiver, routing_key)
    if schema is None:
        return None
    return Plan(adapter_for(schema), routing_key, target_version(receiver, routing_key))


def validate_for(receiver: Any, routing_key: str, headers: Any, body: Any) -> Any:
    """``body`` (decoded) as the instance ``receiver`` gets for it: upcast from the version
    its ``headers`` say to the topic's, then validated; ``None`` when the receiver is
    untyped. ``ValidationError`` names what does not fit (the admin's edit page)."""
    plan = plan_for(receiver, routing_key)
    return None if plan is None else plan.validate(headers, body)
