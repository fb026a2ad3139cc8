"""A retry copy the broker refuses is isolated while the consumer keeps serving: heartbeats
every 2 s, and a second receiver on another queue handling its messages (the real broker).

Receiver A fails each message once; the retry copy of its culprit carries a ``user_id``
that is not the login (the early check off: RabbitMQ closes the copies' channel, 406). The
confirm window then publishes the copies left without an answer one at a time, a pause
between two steps, so the search lasts several heartbeat intervals. Receiver B's messages
are published when the search starts. Told by the order of events, not by times: every B
message was handled after the search started and before it ended, the culprit is parked
with the broker's reason, A's other messages were retried once each, nothing is lost, and
the consumer never reconnected (a connection whose heartbeats went unserved for two
intervals is closed by the broker).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter

import pika
import pytest
from django.conf import settings
from django.test import override_settings

from django_rmq_retry import Topic
from django_rmq_retry.broker import window
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import default_registry
from tests.conftest import BROKER_URL
from tests.test_retry_copy_refusals import refuse_the_culprits_copy

pytestmark = [
    pytest.mark.broker,
    pytest.mark.django_db(transaction=True),
]

#: Neighbours of the culprit on A's queue, before it and after it.
BEFORE, AFTER = 2, 4
#: B's messages, published once the search started.
B_MESSAGES = 20
#: Seconds between two steps of the search: with 2 s heartbeats, several intervals in all.
STEP_PAUSE = 2.5


class Events(logging.Handler):
    """The search's start and end, from the window's log lines, in one list with the
    receivers' runs; its start wakes B's publisher."""

    def __init__(self, events: list[tuple[str, str]], started: threading.Event) -> None:
        super().__init__(logging.INFO)
        self.events = events
        self.started = started

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "retry copies channel over one message" in text:
            self.events.append(("search", "start"))
            self.started.set()
        elif "retry copies channel publishes again" in text:
            self.events.append(("search", "end"))


def _publish(exchange: str, key: str, ids: list[str]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    ch = conn.channel()
    ch.confirm_delivery()
    for message_id in ids:
        props = pika.BasicProperties(
            content_type="application/json", delivery_mode=2, message_id=message_id
        )
        body = json.dumps({"id": message_id}).encode()
        ch.basic_publish(exchange, key, body, props, mandatory=True)
    conn.close()


def test_a_refused_copy_is_isolated_while_heartbeats_and_another_queue_flow(
    rmq, registry_snapshot, monkeypatch
):
    refuse_the_culprits_copy(monkeypatch)
    monkeypatch.setattr(window, "ISOLATION_STEP_PAUSE", STEP_PAUSE)

    events: list[tuple[str, str]] = []
    runs: Counter[str] = Counter()

    def iso_a(message, **kwargs):
        key = message.properties["message_id"]
        runs[key] += 1
        events.append(("a", key))
        if message.attempt == 1:
            raise ValueError("first attempt fails")

    def iso_b(message, **kwargs):
        key = message.properties["message_id"]
        runs[key] += 1
        events.append(("b", key))

    retry = {"max_attempts": 3, "initial_delay": 0.1, "jitter": "none"}
    Topic("test.iso.a").connect(iso_a, retry=retry)
    Topic("test.iso.b").connect(iso_b, retry=retry)
    started = threading.Event()
    handler = Events(events, started)
    broker_log = logging.getLogger("django_rmq_retry.broker")
    broker_log.addHandler(handler)
    old_level = broker_log.level
    broker_log.setLevel(logging.INFO)
    b_ids = [f"b{i}" for i in range(B_MESSAGES)]
    conf = {**settings.RMQ_RETRY, "HEARTBEAT": 2, "DELAY_LANDING_MS": 0}
    try:
        with override_settings(RMQ_RETRY=conf):
            rmq.setup()
            exchange = rmq.names.work_exchange
            a_ids = [f"n{i}" for i in range(BEFORE)] + ["culprit"]
            a_ids += [f"n{i}" for i in range(BEFORE, BEFORE + AFTER)]
            _publish(exchange, "test.iso.a", a_ids)

            def publish_b() -> None:
                if started.wait(timeout=300):
                    _publish(exchange, "test.iso.b", b_ids)

            publisher = threading.Thread(target=publish_b, daemon=True)
            publisher.start()
            receivers = [default_registry.find(name, rmq.prefix) for name in ("iso_a", "iso_b")]
            assert all(receivers)
            stats = Consumer(receivers, consume_orphans=False, max_idle_time=3, relay=False).run()
            publisher.join(timeout=60)
    finally:
        broker_log.removeHandler(handler)
        broker_log.setLevel(old_level)

    parked = {p.message_id: p for p in ParkedMessage.objects.all()}
    neighbours = [key for key in a_ids if key != "culprit"]
    print(f"stats={stats} runs={dict(runs)} parked={sorted(parked)} events={events}")

    # The search happened, once, and every B message was handled inside it.
    assert events.count(("search", "start")) == 1 and events.count(("search", "end")) == 1
    start, end = events.index(("search", "start")), events.index(("search", "end"))
    b_at = [i for i, (who, _key) in enumerate(events) if who == "b"]
    assert len(b_at) == B_MESSAGES and all(start < i < end for i in b_at), events
    assert all(runs[key] == 1 for key in b_ids)

    # The culprit is parked with the broker's reason, once run; the others retried once.
    assert set(parked) == {"culprit"}
    row = parked["culprit"]
    assert row.reason == "non_retryable" and row.attempts == 1
    assert "refuses its retry copy" in row.reason_detail and "406" in row.reason_detail
    assert runs["culprit"] == 1
    assert stats.retried == len(neighbours)  # each original acked once, after its copy
    # A copy stored before the channel closed and published again by the search runs
    # twice (at least once); never more.
    assert all(2 <= runs[key] <= 3 for key in neighbours), runs
    assert all(runs[f"n{i}"] == 2 for i in range(BEFORE, BEFORE + AFTER)), runs

    # Lost: none. And the consumer's connection lived through it (2 s heartbeats).
    assert rmq.depth(rmq.queue("iso_a")) == 0 and rmq.depth(rmq.queue("iso_b")) == 0
    assert stats.reconnects == 0
    assert stats.parked == 1
