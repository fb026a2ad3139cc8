"""Schema versions: the ``schema_version`` header and the upcasters between versions.

A typed topic says which version of its schema it speaks (``Topic(..., schema=OrderPaid,
schema_version=2)``) and ``send`` writes it in the ``schema_version`` header; a message
without the header is version 1 (what every producer sent before versions existed, a
foreign client included). During a rolling deploy the queue holds both shapes, so before
validation the consumer turns an older body into the topic's shape with the functions
registered by ``@upcaster(topic, 1, 2)``, one step at a time (1 -> 2 -> 3). Nothing old is
parked for being old; a version with no way to the topic's is parked as *invalid*.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..core.errors import ValidationError

#: The header naming the schema version of a message's body (not ours alone: a foreign
#: producer sets it too, so it carries no prefix).
HEADER = "schema_version"

Upcast = Callable[[Any], Any]
_steps: dict[tuple[str, int], tuple[int, Upcast]] = {}
_lock = threading.Lock()


def upcaster(topic: Any, from_version: int, to_version: int) -> Callable[[Upcast], Upcast]:
    """Decorator: ``@upcaster(order_paid, 1, 2)`` on ``def v1_to_v2(body) -> body``.

    The function gets the decoded body of version ``from_version`` and returns it in the
    shape of ``to_version`` (a new dict, or the same one changed). It runs before
    validation, on every consumer of the topic.
    """
    routing_key = getattr(topic, "routing_key", topic)
    if not isinstance(routing_key, str):
        raise TypeError(f"upcaster(): give a Topic or a routing key, got {topic!r}")
    if not (_is_version(from_version) and _is_version(to_version) and to_version > from_version):
        raise ValueError(
            f"upcaster({routing_key!r}, {from_version!r}, {to_version!r}): versions are "
            "integers from 1, and it goes up (1, 2)"
        )

    def register(func: Upcast) -> Upcast:
        with _lock:
            existing = _steps.get((routing_key, from_version))
            if existing is not None and existing[1] is not func:
                raise ValueError(
                    f"two upcasters of {routing_key!r} from version {from_version}: "
                    f"{getattr(existing[1], '__qualname__', existing[1])} and "
                    f"{getattr(func, '__qualname__', func)}"
                )
            _steps[(routing_key, from_version)] = (to_version, func)
        return func

    return register


def forget(topic: Any) -> None:
    """Drop every upcaster of ``topic`` (for tests)."""
    routing_key = getattr(topic, "routing_key", topic)
    with _lock:
        for key in [k for k in _steps if k[0] == routing_key]:
            del _steps[key]


def version_of(headers: Mapping[str, Any] | None) -> int:
    """The ``schema_version`` a message says it has (1 without the header);
    ``ValidationError`` for a value that is no version."""
    value = (headers or {}).get(HEADER, 1)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not _is_version(value):
        raise ValidationError([{"loc": [], "msg": f"{HEADER} header {value!r} is no version"}])
    return int(value)


def upcast(routing_key: str, version: int, target: int, body: Any) -> Any:
    """``body`` of ``version`` in the shape of ``target``, through the registered steps;
    ``ValidationError`` if there is no way (a newer version, a missing step) or a step
    raises."""
    if version > target:
        raise ValidationError(
            [{"loc": [], "msg": f"{HEADER} {version} is newer than this consumer's ({target})"}]
        )
    while version < target:
        step = _steps.get((routing_key, version))
        if step is None:
            raise ValidationError(
                [{"loc": [], "msg": f"no upcaster of {routing_key!r} from {HEADER} {version}"}]
            )
        to_version, func = step
        try:
            body = func(body)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValidationError(
                [{"loc": [], "msg": f"upcasting from {HEADER} {version} failed: {exc!r}"}]
            ) from None
        version = to_version
    if version != target:
        raise ValidationError(
            [{"loc": [], "msg": f"the upcasters lead to {HEADER} {version}, not {target}"}]
        )
    return body


def _is_version(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
