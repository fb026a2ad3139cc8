"""``manage.py rmq_asyncapi``: the AsyncAPI 3.0 document of this project's messaging."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandParser

import django_rmq_retry
from django_rmq_retry.conf import broker_urls, current_names, current_plan
from django_rmq_retry.core.asyncapi import document
from django_rmq_retry.registry import default_registry


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
        )
        doc["info"]["x-generator"] = f"django-rmq-retry {django_rmq_retry.__version__}"
        self.stdout.write(json.dumps(doc, indent=2, sort_keys=False))
