"""The dataclass adapter (``schemas``): standard library only.

A ``@dataclass`` has no validator of its own, so this one converts a decoded JSON body by
the field types, the way msgspec and pydantic's lax mode do for JSON input: ``int`` (not
``bool``), ``float`` (an int too), ``str``, ``bool``, ``Decimal`` (from a string or a
number), ``datetime``/``date``/``time`` (ISO 8601), ``UUID``, enums (by value),
``Literal``, ``Optional``/unions, ``list``/``tuple``/``set``/``dict`` of those, nested
dataclasses, and ``Any``. It collects every failing field, not only the first.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import types
import typing
import uuid
from typing import Any

from ..core.errors import FieldError, ValidationError

_MISSING = dataclasses.MISSING
_hints_cache: dict[type, dict[str, Any]] = {}


class DataclassAdapter:
    library = "dataclass"

    def __init__(self, schema: type) -> None:
        self.schema = schema
        _hints(schema)  # a type hint that cannot be resolved fails at declaration

    def validate(self, body: Any) -> Any:
        errors: list[FieldError] = []
        value = _convert(body, self.schema, [], errors)
        if errors:
            raise ValidationError(errors, self.schema.__name__)
        return value

    def is_instance(self, value: Any) -> bool:
        return isinstance(value, self.schema)

    def encode(self, instance: Any) -> bytes:
        return json.dumps(
            _plain(instance), separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")

    def json_schema(self) -> dict[str, Any]:
        defs: dict[str, Any] = {}
        root = _schema_of(self.schema, defs)
        return {**root, "$defs": defs} if defs else root


def _hints(cls: type) -> dict[str, Any]:
    hints = _hints_cache.get(cls)
    if hints is None:
        hints = _hints_cache[cls] = typing.get_type_hints(cls)
    return hints


class _Bad(Exception):
    """One value that does not fit (its message)."""


def _convert(value: Any, tp: Any, loc: list[Any], errors: list[FieldError]) -> Any:
    """``value`` as ``tp``; failures appended to ``errors`` (the result is then unused)."""
    try:
        return _one(value, tp, loc, errors)
    except _Bad as bad:
        errors.append({"loc": loc, "msg": str(bad)})
        return None


def _one(value: Any, tp: Any, loc: list[Any], errors: list[FieldError]) -> Any:
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _union(value, typing.get_args(tp), loc, errors)
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise _Bad(f"Input should be one of {list(typing.get_args(tp))!r}")
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        return _sequence(value, tp, origin or tp, loc, errors)
    if origin is dict or tp is dict:
        return _mapping(value, tp, loc, errors)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(value, tp, loc, errors)
    return _scalar(value, tp)


def _union(value: Any, options: tuple[Any, ...], loc: list[Any], errors: list[FieldError]) -> Any:
    if value is None and type(None) in options:
        return None
    first: list[FieldError] | None = None
    for option in options:
        if option is type(None):
            continue
        tried: list[FieldError] = []
        result = _convert(value, option, loc, tried)
        if not tried:
            return result
        first = first if first is not None else tried
    errors.extend(first or [{"loc": loc, "msg": "Input should not be null"}])
    return None


def _sequence(value: Any, tp: Any, kind: Any, loc: list[Any], errors: list[FieldError]) -> Any:
    if not isinstance(value, list):
        raise _Bad("Input should be a valid array")
    args = typing.get_args(tp)
    if kind is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise _Bad(f"Input should have {len(args)} items")
        return tuple(
            _convert(v, a, [*loc, i], errors)
            for i, (v, a) in enumerate(zip(value, args, strict=True))
        )
    item = args[0] if args else Any
    items = [_convert(v, item, [*loc, i], errors) for i, v in enumerate(value)]
    return items if kind is list else kind(items)


def _mapping(value: Any, tp: Any, loc: list[Any], errors: list[FieldError]) -> Any:
    if not isinstance(value, dict):
        raise _Bad("Input should be a valid object")
    args = typing.get_args(tp)
    key_tp, value_tp = args if len(args) == 2 else (Any, Any)
    return {
        _convert(k, key_tp, [*loc, k], errors): _convert(v, value_tp, [*loc, k], errors)
        for k, v in value.items()
    }


def _dataclass(value: Any, cls: type, loc: list[Any], errors: list[FieldError]) -> Any:
    if not isinstance(value, dict):
        raise _Bad(f"Input should be an object ({cls.__name__})")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    before = len(errors)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in value:
            if f.default is _MISSING and f.default_factory is _MISSING:
                errors.append({"loc": [*loc, f.name], "msg": "Field required"})
            continue
        kwargs[f.name] = _convert(value[f.name], hints.get(f.name, Any), [*loc, f.name], errors)
    if len(errors) > before:
        return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # a __post_init__ that refuses the values
        raise _Bad(str(exc)) from None


def _scalar(value: Any, tp: Any) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Bad("Input should be a valid boolean")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Bad("Input should be a valid integer")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _Bad("Input should be a valid number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Bad("Input should be a valid string")
    if tp is decimal.Decimal:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            try:
                number = decimal.Decimal(str(value))
            except decimal.InvalidOperation:
                raise _Bad("Input should be a valid decimal") from None
            if number.is_finite():
                return number
        raise _Bad("Input should be a valid decimal")
    if tp in (dt.datetime, dt.date, dt.time):
        if isinstance(value, str):
            try:
                text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
                parsed = tp.fromisoformat(text)
            except ValueError:
                pass
            else:
                if tp is not dt.date or not isinstance(parsed, dt.datetime):
                    return parsed
        raise _Bad(f"Input should be a valid {tp.__name__} (ISO 8601)")
    if tp is uuid.UUID:
        try:
            return uuid.UUID(value)
        except (TypeError, ValueError, AttributeError):
            raise _Bad("Input should be a valid UUID") from None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise _Bad(f"Input should be one of {[m.value for m in tp]!r}") from None
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _Bad(f"Input should be a {tp.__name__}")
    return value


def _plain(value: Any) -> Any:
    """An instance as JSON values: ``Decimal`` and datetimes as exact strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return value


_SCALARS: dict[Any, dict[str, Any]] = {
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    decimal.Decimal: {"type": "string", "format": "decimal"},
    dt.datetime: {"type": "string", "format": "date-time"},
    dt.date: {"type": "string", "format": "date"},
    dt.time: {"type": "string", "format": "time"},
    uuid.UUID: {"type": "string", "format": "uuid"},
}


def _schema_of(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of a type, nested dataclasses under ``$defs``."""
    if tp in _SCALARS:
        return dict(_SCALARS[tp])
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema_of(a, defs) for a in args]}
    if tp is type(None):
        return {"type": "null"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        return {"type": "array", "items": _schema_of(args[0], defs) if args else {}}
    if origin is dict or tp is dict:
        return {"type": "object", "additionalProperties": _schema_of(args[1], defs) if args else {}}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # a recursive dataclass refers to itself
            hints = _hints(tp)
            fields = [f for f in dataclasses.fields(tp) if f.init]
            defs[tp.__name__] = {
                "title": tp.__name__,
                "type": "object",
                "properties": {f.name: _schema_of(hints.get(f.name, Any), defs) for f in fields},
                "required": [
                    f.name
                    for f in fields
                    if f.default is _MISSING and f.default_factory is _MISSING
                ],
            }
        return {"$ref": f"#/$defs/{tp.__name__}"}
    return {}
