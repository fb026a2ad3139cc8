"""``manage.py rmq_asyncapi``: a valid AsyncAPI 3.0 document that shows the retry and park paths.

Validity is checked against the official JSON schema of AsyncAPI 3.0 (the npm package
``@asyncapi/specs``, installed into tests/asyncapi with ``npm ci``), not against our idea of it.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry.conf import current_levels
from django_rmq_retry.core.names import OUR_HEADERS

HERE = Path(__file__).resolve().parent / "asyncapi"
SCHEMA = HERE / "node_modules/@asyncapi/specs/schemas/3.0.0-without-$id.json"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    if not SCHEMA.exists():
        npm = shutil.which("npm")
        if not npm:
            pytest.fail("npm is needed: apt-get install -y nodejs npm", pytrace=False)
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300)
    return json.loads(SCHEMA.read_text())


def _document(**options: Any) -> dict[str, Any]:
    out = io.StringIO()
    call_command("rmq_asyncapi", stdout=out, **options)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_document_is_valid_asyncapi_3(schema: dict[str, Any], queue_type: str) -> None:
    import jsonschema

    with override_settings(RMQ_RETRY={"QUEUE_TYPE": queue_type, "PREFIX": "shop"}):
        doc = _document(title="Shop events", api_version="2.1.0")
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    assert errors == []
    assert doc["asyncapi"] == "3.0.0"
    assert (doc["info"]["title"], doc["info"]["version"]) == ("Shop events", "2.1.0")


def test_the_schema_check_can_fail(schema: dict[str, Any]) -> None:
    """The validator is not a rubber stamp: a wrong action is refused."""
    import jsonschema

    doc = _document()
    next(iter(doc["operations"].values()))["action"] = "publish"  # AsyncAPI 2's word
    assert list(jsonschema.Draft7Validator(schema).iter_errors(doc))


def test_it_shows_the_retry_and_park_paths_with_their_arguments() -> None:
    with override_settings(RMQ_RETRY={"PREFIX": "shop", "QUEUE_TYPE": "quorum"}):
        doc = _document()
        levels = current_levels()
    channels = doc["channels"].values()
    delays = [c for c in channels if c["title"].startswith("retry path")]
    assert len(delays) == levels.levels
    level3 = next(c for c in delays if c["address"] == "shop.delay.03")
    args = level3["bindings"]["amqp"]["x-arguments"]
    assert args["x-message-ttl"] == levels.ttl_ms(3)
    assert args["x-dead-letter-exchange"] == "shop.delay.02"
    assert args["x-dead-letter-strategy"] == "at-least-once"
    parks = {c["address"] for c in channels if c["title"].startswith("park path")}
    assert parks == {"shop.orphans", "shop.dead"}


def test_every_receiver_has_a_queue_channel_and_a_receive_operation() -> None:
    from django_rmq_retry.registry import default_registry

    with override_settings(RMQ_RETRY={"PREFIX": "shop"}):
        doc = _document()
    receivers = default_registry.all()
    assert receivers, "the test settings register receivers"
    for rec in receivers:
        queue = rec.queue_name("shop")
        channel = next(c for c in doc["channels"].values() if c["address"] == queue)
        assert channel["bindings"]["amqp"]["is"] == "queue"
        assert any(op["title"] == f"receiver {rec.name}" for op in doc["operations"].values())
    headers = doc["components"]["messages"]["message"]["headers"]["properties"]
    assert set(headers) == {f"shop-{suffix}" for suffix in OUR_HEADERS}
