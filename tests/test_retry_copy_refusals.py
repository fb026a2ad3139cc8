"""A retry copy the broker refuses parks its original; it never costs the consumer its
connection (the real broker).

Ten neighbours fail once and then succeed; the culprit fails once and its retry copy is one
the broker refuses: its user_id is not the login (the early check off: RabbitMQ closes the
copies' channel, 406), or its body is over ``MAX_MESSAGE_BYTES`` (refused before it is sent).
Before, the consumer took the closed channel for an outage: it reconnected, the receivers
ran again, and the culprit looped until a delivery limit parked it as "connection lost".
Counted here: receiver runs per message, parked rows and their reasons, lost (none).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Topic
from django_rmq_retry.broker import confirms
from django_rmq_retry.consumer import handler as handler_module
from django_rmq_retry.models import ParkedMessage
from tests.conftest import BROKER_URL

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def _publish_raw(rmq, key: str, body: bytes) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2, message_id=key)
    ch.basic_publish(rmq.names.work_exchange, "test.refusals", body, props, mandatory=True)
    conn.close()


def _run(rmq, culprit_body: bytes, **conf: Any) -> tuple[Counter[str], dict[str, Any]]:
    topic = Topic("test.refusals")
    runs: Counter[str] = Counter()

    def flaky(message, **kwargs):
        key = message.properties["message_id"]
        runs[key] += 1
        if message.attempt == 1:
            raise ValueError("first attempt fails")

    topic.connect(flaky, retry={"max_attempts": 3, "initial_delay": 0.1, "jitter": "none"})
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "DELAY_LANDING_MS": 0, **conf}):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        for i in range(5):
            _publish_raw(rmq, f"n{i}", json.dumps({"id": i}).encode())
        _publish_raw(rmq, "culprit", culprit_body)
        for i in range(5, 10):
            _publish_raw(rmq, f"n{i}", json.dumps({"id": i}).encode())
        call_command("rmq_consume", "flaky", max_idle_time=3, verbosity=0)
    parked = {p.message_id: p for p in ParkedMessage.objects.all()}
    return runs, parked


def _check(
    rmq, runs: Counter[str], parked: dict[str, Any], words: tuple[str, ...], resent: int = 0
) -> None:
    """Each neighbour ran twice (fail, then its copy), the culprit once. ``resent``: the
    copies published before the culprit on the channel the broker closed got no answer and
    are published once more (at-least-once): their receivers may run once more, no more."""
    extra = {key: runs[key] - 2 for key in runs if key != "culprit"}
    duplicates = sum(extra.values())
    print(f"runs={dict(runs)} parked={sorted(parked)} duplicates={duplicates} lost=0")
    assert runs["culprit"] == 1  # no reconnect ran it (or anything) again
    assert set(extra) == {f"n{i}" for i in range(10)}
    assert all(0 <= n <= 1 for n in extra.values()), extra  # bounded: once at most
    assert all(extra[f"n{i}"] == 0 for i in range(5, 10))  # after it: flowed untouched
    assert duplicates <= resent
    assert set(parked) == {"culprit"}  # lost: none; parked: the culprit alone
    row = parked["culprit"]
    assert row.reason == "non_retryable" and row.attempts == 1
    assert "refuses its retry copy" in row.reason_detail
    for word in words:
        assert word in row.reason_detail
    assert rmq.depth(rmq.queue("flaky")) == 0


def refuse_the_culprits_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry copy of message ``culprit`` carries a ``user_id`` that is not the login,
    and the early check is off: RabbitMQ closes the copies' channel over it (406)."""
    monkeypatch.setattr(confirms, "early_refusal", lambda *a, **k: "", raising=False)
    real = handler_module.retry_properties

    def with_a_foreign_user_id(props: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        copy = real(props, **kwargs)
        if props.get("message_id") == "culprit":
            copy["user_id"] = "mallory"  # RabbitMQ: 406, the copies' channel closed
        return copy

    monkeypatch.setattr(handler_module, "retry_properties", with_a_foreign_user_id)


def test_a_copy_the_broker_refuses_parks_its_original_without_a_reconnect(
    rmq, registry_snapshot, monkeypatch
):
    refuse_the_culprits_copy(monkeypatch)
    runs, parked = _run(rmq, json.dumps({"id": "culprit"}).encode())
    _check(rmq, runs, parked, ("406", "user_id"), resent=5)


def test_a_copy_over_the_maximum_message_size_is_refused_before_it_is_sent(rmq, registry_snapshot):
    body = json.dumps({"id": "culprit", "pad": "x" * 3000}).encode()
    runs, parked = _run(rmq, body, MAX_MESSAGE_BYTES=2000)
    _check(rmq, runs, parked, ("maximum message size",))
