"""A typed topic's side of ``send``: what is published is an instance of the schema.

``Topic.send`` of a typed topic takes an instance (encoded by its library: msgspec's and
pydantic's own JSON encoders, ``Decimal`` and datetimes exact) or a JSON value (a dict,
or JSON bytes), validated first: one that does not fit raises ``ValidationError`` before
anything is published.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..core.errors import ValidationError
from . import Adapter, adapter_for, is_schema


def typed_adapter(routing_key: str, schema: Any, version: Any) -> Adapter | None:
    """The adapter of a topic's ``schema`` (``None``: untyped); ``ImproperlyConfigured``
    names what is wrong with the declaration."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ImproperlyConfigured(
            f"Topic {routing_key!r}: schema_version= must be an integer from 1, got {version!r}."
        )
    if schema is None:
        return None
    if not is_schema(schema):
        raise ImproperlyConfigured(
            f"Topic {routing_key!r}: schema={schema!r} must be a msgspec.Struct, a pydantic "
            "BaseModel or a @dataclass class."
        )
    try:
        return adapter_for(schema)
    except TypeError as exc:
        raise ImproperlyConfigured(f"Topic {routing_key!r}: {exc}") from exc


def encode_typed(adapter: Adapter, body: Any, content_type: str | None = None) -> bytes:
    """``body`` validated and as JSON bytes (an instance: by its library)."""
    if adapter.is_instance(body):
        return adapter.encode(body)
    if isinstance(body, bytes | bytearray | memoryview | str):
        if content_type and "json" not in content_type:
            raise ValidationError(
                [{"loc": [], "msg": f"a typed topic sends JSON, not {content_type}"}],
                adapter.schema.__name__,
            )
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise ValidationError(
                [{"loc": [], "msg": f"not JSON: {exc}"}], adapter.schema.__name__
            ) from None
        adapter.validate(value)
        return raw
    return adapter.encode(adapter.validate(body))
