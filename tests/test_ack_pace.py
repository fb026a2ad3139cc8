"""Acks go out at half a prefetch window: the broker refills the window while the rest runs.

A receiver thread running fast receivers would otherwise keep the interpreter lock through
the whole window, and the connection's thread acked it only once it was empty.
"""

from __future__ import annotations

import threading

import pytest
from django.core.management import call_command

from django_rmq_retry import Topic
from django_rmq_retry.broker import connection
from django_rmq_retry.consumer import loop
from django_rmq_retry.consumer.loop import Consumer
from django_rmq_retry.registry import default_registry

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

PREFETCH = 8


def test_half_a_window_is_acked_before_the_rest_of_it_runs(rmq, registry_snapshot, monkeypatch):
    """Sixteen deliveries through a window of eight: whenever a receiver starts, fewer than
    half a window of finished deliveries wait for their ack (the broker has the others'
    slots back)."""
    acked: list[tuple[int, bool]] = []
    seen_at_start: list[list[tuple[int, bool]]] = []
    real_ack = connection.Channel.ack

    def recording_ack(self: connection.Channel, tag: int, multiple: bool = False) -> None:
        real_ack(self, tag, multiple)
        acked.append((tag, multiple))

    monkeypatch.setattr(connection.Channel, "ack", recording_ack)
    # However slow the machine, the receiver thread waits for the ack (never 50 ms only).
    monkeypatch.setattr(loop, "PACE_WAIT", 30.0)
    topic = Topic("test.pace")

    @topic.connect
    def pace_probe(message, **kwargs):
        seen_at_start.append(list(acked))

    call_command("rmq_consume", setup_only=True, verbosity=0)
    probe = default_registry.find("pace_probe", rmq.names.prefix)
    assert probe is not None
    topic.send_many([{"n": i} for i in range(2 * PREFETCH)])
    consumer = Consumer([probe], consume_orphans=False, prefetch=PREFETCH, max_messages=16)
    thread = threading.Thread(target=consumer.run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert consumer.stats.handled == 2 * PREFETCH
    assert len(seen_at_start) == 2 * PREFETCH
    # Delivery tags start at 1 on the consumer's channel, in delivery order (one thread).
    for started, acks in enumerate(seen_at_start):
        covered = max((tag for tag, multiple in acks if multiple), default=0)
        done = {t for t in range(1, started + 1) if t <= covered or (t, False) in acks}
        assert started - len(done) < PREFETCH // 2, (started, acks)
    assert rmq.depth(rmq.queue("pace_probe")) == 0
