"""What a publish gives back and how its failures read: results, outcomes, the messages
built from bodies, and the wording of every ``PublishError`` the publisher raises.

Kept apart from :mod:`.publisher` (the transport and its rules) so that the words a user
reads are in one place; ``publisher`` re-exports the public names.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder

from .. import broker
from ..conf import app_settings, current_names
from ..core import bodies
from ..core.envelope import build_properties
from ..core.errors import PublishError
from ..registry import app_missing_hint, default_registry
from .partitions import partitioner

_E = TypeVar("_E", bound=PublishError)

#: Bodies become JSON with Django's encoder (dates, decimals, UUIDs).
encode_body = functools.partial(bodies.encode_body, encoder=DjangoJSONEncoder)


@dataclass(frozen=True)
class PublishResult:
    message_id: str
    exchange: str
    routing_key: str


@dataclass(frozen=True)
class PublishOutcome:
    """What the broker said of each message a stream published (:meth:`Publisher.stream_items`).

    A message is in one list at most: ``confirmed`` (stored), ``failed`` (nacked, or
    returned as unroutable: a later attempt may succeed) or ``refused`` (for what it
    carries, ``item.refused`` says why: the same message will never be taken). A message
    in none got no answer: ``error`` then says why the stream stopped (the broker could not
    be reached, the channel closed, no confirm in time), and it may or may not be stored.
    """

    confirmed: list[broker.Outgoing]
    failed: list[broker.Outgoing]
    refused: list[broker.Outgoing]
    error: PublishError | None = None

    @classmethod
    def of(
        cls, sent: Iterable[broker.Outgoing], error: PublishError | None = None
    ) -> PublishOutcome:
        """The outcome of the messages ``sent``, each as its answer left it."""
        confirmed, failed, refused = [], [], []
        for item in sent:
            if item.confirmed:
                confirmed.append(item)
            elif item.refused:
                refused.append(item)
            elif item.nacked or item.returned:
                failed.append(item)
        return cls(confirmed, failed, refused, error)


def outgoing(
    routing_key: str,
    bodies: Iterable[Any],
    *,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
    exchange: str | None = None,
    **properties: Any,
) -> list[broker.Outgoing]:
    """``bodies`` encoded as messages for ``routing_key``; every body is encoded before the
    first one is sent, so one that is not JSON serialisable publishes nothing."""
    names = current_names()
    exchange = exchange if exchange is not None else names.work_exchange
    items = []
    partition = partitioner(routing_key, exchange, names)
    for body in bodies:
        data, ctype = encode_body(body, content_type)
        props = build_properties(ctype, headers, properties, names)
        if partition is not None:
            partition(data, props)
        items.append(broker.Outgoing(exchange, routing_key, data, props))
    return items


def answers(items: Sequence[broker.Outgoing]) -> dict[str, list[Any]]:
    """A ``PublishError``'s ``confirmed`` (the :class:`PublishResult` of each of ``items``
    the broker confirmed) and ``failed`` (the others' message ids)."""
    return {
        "confirmed": [
            PublishResult(i.message_id, i.exchange, i.routing_key) for i in items if i.confirmed
        ],
        "failed": [i.message_id for i in items if not i.confirmed],
    }


def batch_error(items: list[broker.Outgoing], text: str, kind: type[_E]) -> _E:
    found = answers(items)
    return kind(f"{text} ({len(found['confirmed'])} of {len(items)} confirmed)", **found)


def unrouted_hint(item: broker.Outgoing) -> str:
    """For a topic's send (the work exchange): which receivers this process knows."""
    if item.exchange != current_names().work_exchange:
        return ""
    hint = default_registry.unrouted_hint(item.routing_key, str(app_settings.DISCOVER_MODULE))
    return f". {hint}"


def undeclared_hint(error: str) -> str:
    """A publish to one of our exchanges that the broker does not have: the topology was
    never declared there (publishers need write permission only and declare nothing)."""
    if "NOT_FOUND" not in error or f"'{current_names().prefix}." not in error:
        return ""
    missing = app_missing_hint()
    if missing:
        return f". {missing}"
    return (
        ". The topology is not declared on this broker: run `manage.py rmq_setup` (or start "
        "`manage.py rmq_consume`) with the same BROKER_URL and PREFIX first"
    )


__all__ = [
    "PublishOutcome",
    "PublishResult",
    "answers",
    "batch_error",
    "encode_body",
    "outgoing",
    "undeclared_hint",
    "unrouted_hint",
]
