"""An AsyncAPI 3.0 document of what this project puts on the broker. Pure.

Generators of AsyncAPI documents (FastStream's among them) describe topics and queues but
not what happens to a message that fails: their AMQP bindings carry no queue arguments, so
a TTL queue that dead-letters into the next one cannot be told from an ordinary queue. Ours
is built from the same :class:`~django_rmq_retry.core.topology_plan.Plan` that ``rmq_consume``
declares, so it shows the retry path (every delay level with its TTL and dead-letter
exchange, the deliver exchange and its alternate) and the park path (orphans and, with
quorum queues, dead letters, which every consumer reads and parks) exactly as declared.
A typed topic's (or receiver's) messages carry its schema as their payload's JSON Schema,
and the ``schema_version`` header: the contract a foreign producer can be checked against.

``manage.py rmq_asyncapi`` prints it; the documentation site renders it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .names import OUR_HEADERS, Names
from .topology_plan import Plan

ASYNCAPI_VERSION = "3.0.0"


def _exchange(name: str, kind: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "is": "routingKey",
        "exchange": {
            "name": name,
            "type": kind,
            "durable": True,
            "autoDelete": False,
            "vhost": "/",
        },
        "bindingVersion": "0.3.0",
        **({"x-arguments": dict(arguments)} if arguments else {}),
    }


def _queue(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "is": "queue",
        "queue": {
            "name": name,
            "durable": True,
            "exclusive": False,
            "autoDelete": False,
            "vhost": "/",
        },
        "bindingVersion": "0.3.0",
        **({"x-arguments": dict(arguments)} if arguments else {}),
    }


def _key(name: str) -> str:
    """A channel id: AsyncAPI keys may not contain every character a queue name can."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def headers_schema(names: Names) -> dict[str, Any]:
    """JSON Schema of the headers we own (every other header is the sender's and kept)."""
    return {
        "type": "object",
        "properties": {
            names.header(suffix): {"description": text} for suffix, text in OUR_HEADERS.items()
        },
        "additionalProperties": True,
    }


def document(
    plan: Plan,
    names: Names,
    receivers: Iterable[tuple[str, str, list[str]]],
    *,
    title: str,
    version: str,
    server: str | None = None,
    schemas: Mapping[str, tuple[Mapping[str, Any], int]] | None = None,
    receiver_schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The AsyncAPI document. ``receivers``: (dotted path, queue name, routing keys);
    ``schemas``: a typed topic's (JSON Schema, schema_version) by routing key;
    ``receiver_schemas``: a receiver's own schema by dotted path."""
    headers = headers_schema(names)
    message = {
        "name": "message",
        "title": "A message on the work exchange",
        "contentType": "application/json",
        "headers": headers,
        "payload": {"description": "The body as sent: JSON, text or bytes (content_type)."},
    }
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    components: dict[str, Any] = {"messages": {"message": message}}
    receivers = list(receivers)
    typed = _Typed(components, headers)
    topic_message = {
        key: typed.message(f"topic.{key}", schema, version, f"A {key} message")
        for key, (schema, version) in (schemas or {}).items()
    }

    routing_keys = sorted({key for _, _, keys in receivers for key in keys})
    for key in routing_keys:
        cid = _key(f"topic.{key}")
        channels[cid] = {
            "address": key,
            "title": f"Topic {key}",
            "description": f"Routing key {key!r} on the work exchange {names.work_exchange}.",
            "messages": {"message": {"$ref": topic_message.get(key, _PLAIN)}},
            "bindings": {"amqp": _exchange(names.work_exchange, "topic", {})},
        }
        operations[_key(f"send.{key}")] = {
            "action": "send",
            "title": f"Topic({key!r}).send",
            "channel": {"$ref": f"#/channels/{cid}"},
            "messages": [{"$ref": f"#/channels/{cid}/messages/message"}],
        }

    by_queue = {q.name: q for q in plan.queues}
    for name, queue_name, keys in receivers:
        spec = by_queue.get(queue_name)
        cid = _key(f"queue.{queue_name}")
        own = (receiver_schemas or {}).get(name)
        if own is not None:
            ref = typed.message(f"receiver.{name}", own, 1, f"What {name} takes")
        else:  # its topics' (one typed topic: its message; several: any plain message)
            refs = {topic_message.get(k, _PLAIN) for k in keys}
            ref = refs.pop() if len(refs) == 1 else _PLAIN
        channels[cid] = {
            "address": queue_name,
            "title": f"Queue of receiver {name}",
            "description": (
                f"Bound to {names.work_exchange} with {', '.join(keys) or 'no key'}, and to "
                f"{names.deliver_exchange} on header {names.target_header} = {queue_name!r} "
                "(its retries and requeues come back this way, to this queue only)."
            ),
            "messages": {"message": {"$ref": ref}},
            "bindings": {"amqp": _queue(queue_name, spec.arguments if spec else {})},
        }
        operations[_key(f"receive.{name}")] = {
            "action": "receive",
            "title": f"receiver {name}",
            "channel": {"$ref": f"#/channels/{cid}"},
            "messages": [{"$ref": f"#/channels/{cid}/messages/message"}],
            "description": (
                "Acked when the receiver returns; on a failure a retry copy goes into the "
                "delay levels (acked once the broker confirmed it), and after the last "
                "attempt the message is parked in the database (acked once committed)."
            ),
        }

    exchanges = {name: (kind, args) for name, kind, args in plan.exchanges}
    for queue in plan.queues:
        if queue.receiver is not None:
            continue
        source = queue.bindings[0].source if queue.bindings else ""
        kind, args = exchanges.get(source, ("topic", {}))
        role = "park path" if queue.parks else "retry path"
        channels[_key(f"{role}.{queue.name}")] = {
            "address": queue.name,
            "title": f"{role}: {queue.name}",
            "description": _describe(queue.name, queue.arguments, queue.parks, names),
            "bindings": {"amqp": _queue(queue.name, queue.arguments)},
            "x-source-exchange": {"name": source, "type": kind, "arguments": dict(args)},
        }

    doc: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": (
                "Generated by django-rmq-retry from the receivers this project declares. "
                "Retries wait in fixed delay levels (TTL queues that dead-letter downwards) "
                "and come back to the failed receiver's queue only; messages that run out "
                "of attempts are parked in the database for an operator."
            ),
        },
        "channels": channels,
        "operations": operations,
        "components": components,
    }
    if server:
        doc["servers"] = {"broker": {"host": server, "protocol": "amqp"}}
    return doc


_PLAIN = "#/components/messages/message"


class _Typed:
    """Typed messages into ``components``: each schema's nested definitions (``$defs``)
    moved to ``components.schemas`` and their references rewritten to point there (a
    ``#/$defs/...`` reference would resolve against the whole document)."""

    def __init__(self, components: dict[str, Any], headers: Mapping[str, Any]) -> None:
        self.components = components
        self.headers = headers

    def message(self, name: str, schema: Mapping[str, Any], version: int, title: str) -> str:
        key = _key(name)
        schemas = self.components.setdefault("schemas", {})
        payload = self._moved(dict(schema), schemas)
        headers = {
            **self.headers,
            "properties": {
                **self.headers["properties"],
                "schema_version": {
                    "description": "The version of the payload's schema (1 when absent).",
                    "type": "integer",
                    "const": version,
                },
            },
        }
        self.components["messages"][key] = {
            "name": key,
            "title": title,
            "contentType": "application/json",
            "headers": headers,
            "payload": payload,
        }
        return f"#/components/messages/{key}"

    def _moved(self, schema: dict[str, Any], schemas: dict[str, Any]) -> Any:
        defs = schema.pop("$defs", None) or schema.pop("definitions", None) or {}
        names: dict[str, str] = {}
        for def_name in defs:  # two different schemas of one name: the later one renamed
            name, n = def_name, 1
            while name in schemas and schemas[name] != _rewrite(defs[def_name], {}):
                n += 1
                name = f"{def_name}{n}"
            names[def_name] = name
        for def_name, definition in defs.items():
            schemas[names[def_name]] = _rewrite(definition, names)
        return _rewrite(schema, names)


def _rewrite(value: Any, names: Mapping[str, str]) -> Any:
    """``value`` with its local references pointing into ``components.schemas``."""
    if isinstance(value, dict):
        out = {k: _rewrite(v, names) for k, v in value.items()}
        ref = out.get("$ref")
        if isinstance(ref, str):
            for local in ("#/$defs/", "#/definitions/"):
                if ref.startswith(local):
                    name = ref[len(local) :]
                    out["$ref"] = "#/components/schemas/" + names.get(name, name)
        return out
    if isinstance(value, list):
        return [_rewrite(v, names) for v in value]
    return value


def _describe(queue: str, arguments: Mapping[str, Any], parks: bool, names: Names) -> str:
    if parks:
        return (
            f"Every consumer also reads {queue} and parks what arrives there "
            "(a retry whose receiver queue vanished, or a quorum queue's dead letter)."
        )
    ttl = arguments.get("x-message-ttl")
    after = arguments.get("x-dead-letter-exchange")
    return f"Delay level: holds each message {ttl} ms, then dead-letters it to {after}."
