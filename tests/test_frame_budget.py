"""Our own headers never push a copy over the connection's frame limit (real broker).

A message whose headers sit near ``frame_max`` is fine on its first delivery; the retry
copy adds ours (attempt, route, due time, error text...). The content header travels in
one frame, so a copy that grows past the negotiated ``frame_max`` is refused by the broker
closing the connection: every unsettled neighbour came back and ran again, and the culprit
looped until the delivery limit parked it as "connection lost". Here the consumer
negotiates ``frame_max`` 8192 through its URL (RabbitMQ honours a client's smaller value;
since 4.1 it refuses a connection that asks for less than 8192).
"""

from __future__ import annotations

import json
from collections import Counter

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Topic
from django_rmq_retry.models import ParkedMessage
from tests.conftest import BROKER_URL

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

FRAME_MAX = 8192  # the smallest RabbitMQ 4.1+ accepts
SMALL_FRAMES = f"{BROKER_URL}{'&' if '?' in BROKER_URL else '?'}frame_max={FRAME_MAX}"


def _header_room(headers: dict) -> int:
    """Bytes left in a content-header frame of ``FRAME_MAX`` for these properties."""
    props = pika.BasicProperties(
        content_type="application/json", delivery_mode=2, message_id="m", headers=headers
    )
    encoded = len(b"".join(props.encode()))
    # frame: 7 header + 1 end; content header: class, weight, body size (12)
    return FRAME_MAX - 8 - 12 - encoded


def _padded(room_left: int) -> dict:
    """Headers that leave exactly ``room_left`` bytes of the frame."""
    headers = {"pad": ""}
    headers["pad"] = "p" * (_header_room(headers) - room_left)
    assert _header_room(headers) == room_left
    return headers


def test_retry_copy_fits_the_frame_or_parks_at_once(rmq, registry_snapshot):
    """Three kinds of message on one receiver (max_attempts 2), consumed at frame_max 8192:

    - ``roomy``: 600 bytes left: our headers, the long error text shrunk, fit: 2 runs,
      parked as exhausted, its copy carries the attempt and a shortened error;
    - ``tight``: 8 bytes left: even our required headers cannot fit: 1 run, parked at once
      with a reason that names the frame limit;
    - ten small neighbours: one run each.
    No reconnect, so no delivery_limit park and no neighbour run twice."""
    topic = Topic("test.frames")
    runs: Counter[str] = Counter()
    errors: dict[str, list] = {}

    def fails_big(message, **kwargs):
        key = message.body["id"]
        runs[key] += 1
        errors.setdefault(key, []).append(message.headers.get(rmq.names.header("error")))
        if key.startswith("n"):
            return
        raise ValueError("it went wrong: " + "e" * 2000)

    topic.connect(fails_big, retry={"max_attempts": 2, "initial_delay": 0.1, "jitter": "none"})
    conf = {**settings.RMQ_RETRY, "BROKER_URL": SMALL_FRAMES, "DELAY_LANDING_MS": 0}
    with override_settings(RMQ_RETRY=conf):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        conn = pika.BlockingConnection(pika.URLParameters(SMALL_FRAMES))
        ch = conn.channel()
        ch.confirm_delivery()

        def send(key: str, headers: dict) -> None:
            props = pika.BasicProperties(
                content_type="application/json", delivery_mode=2, message_id="m", headers=headers
            )
            ch.basic_publish(
                rmq.names.work_exchange,
                "test.frames",
                json.dumps({"id": key}).encode(),
                props,
                mandatory=True,
            )

        send("roomy", _padded(600))
        send("tight", _padded(8))
        for i in range(10):
            send(f"n{i}", {})
        conn.close()
        # roomy twice, the rest once: a count, not an idle window roomy's retry could outlast
        call_command("rmq_consume", "fails_big", max_messages=13, max_idle_time=60, verbosity=0)

    assert runs == {"roomy": 2, "tight": 1, **{f"n{i}": 1 for i in range(10)}}
    parked = {json.loads(bytes(p.body))["id"]: p for p in ParkedMessage.objects.all()}
    assert set(parked) == {"roomy", "tight"}
    assert parked["roomy"].reason == "exhausted"
    assert parked["roomy"].attempts == 2
    # attempt 2 read the error text shortened to what fitted
    shortened = errors["roomy"][1]
    assert shortened.startswith("it went wrong: eee") and shortened.endswith(" [...]")
    assert len(shortened) < 200
    tight = parked["tight"]
    assert tight.attempts == 1
    assert tight.reason != "delivery_limit"
    assert "frame" in tight.reason_detail and str(FRAME_MAX) in tight.reason_detail
    assert rmq.depth(rmq.queue("fails_big")) == 0


def test_a_parked_message_whose_requeue_copy_cannot_fit_is_refused_not_sent(rmq, registry_snapshot):
    """Parked at once because its retry copy could not fit frame_max 8192, the message is
    requeued with a small neighbour: the requeue copy (our route, row id and count) cannot
    fit either, so it is refused before the broker sees it: counted failed with a reason
    naming the frame limit, its row stays parked; the neighbour is requeued and runs."""
    from django_rmq_retry import parking

    topic = Topic("test.frames")
    runs: Counter[str] = Counter()

    def fails_big(message, **kwargs):
        runs[message.body["id"]] += 1
        if message.attempt == 1 and not message.requeued:
            raise ValueError("it went wrong")

    topic.connect(fails_big, retry={"max_attempts": 1, "jitter": "none"})
    conf = {**settings.RMQ_RETRY, "BROKER_URL": SMALL_FRAMES, "DELAY_LANDING_MS": 0}
    with override_settings(RMQ_RETRY=conf):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        conn = pika.BlockingConnection(pika.URLParameters(SMALL_FRAMES))
        ch = conn.channel()
        ch.confirm_delivery()
        for key, headers in (("tight", _padded(8)), ("small", {})):
            props = pika.BasicProperties(
                content_type="application/json", delivery_mode=2, message_id=key, headers=headers
            )
            body = json.dumps({"id": key}).encode()
            ch.basic_publish(rmq.names.work_exchange, "test.frames", body, props, mandatory=True)
        conn.close()
        call_command("rmq_consume", "fails_big", max_idle_time=2, verbosity=0)
        assert ParkedMessage.objects.count() == 2
        result = parking.requeue(ParkedMessage.objects.all())
        assert (result.requeued, result.failed) == (1, 1), result
        assert any(f"frame_max {FRAME_MAX}" in e for e in result.errors), result.errors
        call_command("rmq_consume", "fails_big", max_idle_time=2, verbosity=0)
    assert runs == {"tight": 1, "small": 2}
    statuses = {json.loads(bytes(p.body))["id"]: p.status for p in ParkedMessage.objects.all()}
    assert statuses == {"tight": "parked", "small": "requeued"}
