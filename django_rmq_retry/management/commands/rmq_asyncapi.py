"""``manage.py rmq_asyncapi``: the AsyncAPI 3.0 document of this project's messaging."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandParser

import django_rmq_retry
from django_rmq_retry.conf import broker_urls, current_names, current_plan
from django_rmq_retry.core.asyncapi import document
from django_rmq_retry.registry import Receiver, default_registry
from django_rmq_retry.schemas import adapter_for


class Command(BaseCommand):
    help = (
        "Print an AsyncAPI 3.0 document (JSON) of the topics, receivers and their queues, the "
        "headers we own, and the retry and park paths with their queue arguments."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--title",
            default="django-rmq-retry messaging",
            help="The document's info.title (default: %(default)s).",
        )
        parser.add_argument(
            "--api-version",
            dest="doc_version",
            default="1.0.0",
            help="The document's info.version, your API's version (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        names = current_names()
        receivers = default_registry.all()
        plan = current_plan(receivers)
        url = urlsplit(broker_urls()[0])
        server = f"{url.hostname or 'localhost'}:{url.port or 5672}{url.path or '/'}"
        doc = document(
            plan,
            names,
            [(r.name, r.queue_name(names.prefix), r.routing_keys) for r in receivers],
            title=options["title"],
            version=options["doc_version"],
            server=server,
            schemas=typed_topics(receivers),
            receiver_schemas={
                r.name: adapter_for(r.schema).json_schema() for r in receivers if r.schema
            },
        )
        doc["info"]["x-generator"] = f"django-rmq-retry {django_rmq_retry.__version__}"
        self.stdout.write(json.dumps(doc, indent=2, sort_keys=False))


def typed_topics(receivers: list[Receiver]) -> dict[str, tuple[dict[str, Any], int]]:
    """Each typed topic's JSON Schema and version, by routing key."""
    found: dict[str, tuple[dict[str, Any], int]] = {}
    for rec in receivers:
        for topic in rec.topics:
            schema = getattr(topic, "schema", None)
            if schema is not None and topic.routing_key not in found:
                version = int(getattr(topic, "schema_version", 1))
                found[topic.routing_key] = (adapter_for(schema).json_schema(), version)
    return found
