"""PREFETCH is the bound: a consumer process never holds more unacked deliveries per queue.

Read from the broker itself (``rabbitmqctl list_queues messages_unacknowledged``), while
deliveries that no receiver needs sit in the window: retry copies waiting in the landing
for their due time, and rows waiting for their parked commit while another connection
holds the table's writes. Only ``SPARE_PREFETCH`` (opt-in) may widen it.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Retry, Topic
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import default_registry
from tests.conftest import BROKER_URL, rabbitmqctl_cmd, wait_for
from tests.test_parking import _WritesHeld
from tests.testapp.events import work

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

PREFETCH = 2


def unacked(queue: str) -> int:
    """The broker's count of ``queue``'s deliveries that no consumer acked yet."""
    vhost = pika.URLParameters(BROKER_URL).virtual_host
    out = subprocess.run(
        rabbitmqctl_cmd(
            "list_queues",
            "-p",
            vhost,
            "-q",
            "--no-table-headers",
            "name",
            "messages_unacknowledged",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for line in out.splitlines():
        name, _, count = line.rpartition("\t")
        if name == queue:
            return int(count)
    raise AssertionError(f"no queue {queue} in {out[:500]}")


def samples(queue: str, seconds: float) -> list[int]:
    """The unacked count, read again and again for ``seconds`` (at least three reads)."""
    out: list[int] = []
    deadline = time.monotonic() + seconds
    while len(out) < 3 or time.monotonic() < deadline:
        out.append(unacked(queue))
    return out


def run_consumer(consumer: Consumer) -> Callable[[], None]:
    thread = threading.Thread(target=consumer.run)
    thread.start()

    def stop() -> None:
        consumer.request_stop()
        thread.join(30)
        assert not thread.is_alive()

    return stop


def test_copies_waiting_in_the_landing_never_widen_the_window(rmq, registry_snapshot):
    """Ten messages fail once and retry in 3 s, all of it held in the landing: the process
    holds two copies at a time (the broker counts 2 unacked, 8 ready), never ten; each
    message still runs twice, the second time at or after its due time."""
    topic = Topic("test.bound")
    runs: list[tuple[int, float, int]] = []

    @topic.connect
    def bound_probe(message, **kwargs):
        due = message.headers.get(rmq.names.header("due"))
        runs.append((message.attempt, time.time() * 1000, due or 0))
        if message.attempt == 1:
            raise Retry("once more", delay=3.0)

    conf = {**settings.RMQ_RETRY, "DELAY_LANDING_MS": 3000}
    with override_settings(RMQ_RETRY=conf):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        for n in range(10):
            topic.send({"n": n})
        probe = default_registry.find("bound_probe", rmq.names.prefix)
        assert probe is not None
        queue = rmq.queue("bound_probe")
        consumer = Consumer([probe], consume_orphans=False, prefetch=PREFETCH)
        stop = run_consumer(consumer)
        try:
            assert wait_for(lambda: consumer._pool.held == PREFETCH, timeout=20)
            seen = samples(queue, 2.0)
            assert max(seen) <= PREFETCH, seen
            assert rmq.consumers(queue) == 1
            assert wait_for(lambda: len(runs) == 20, timeout=60), len(runs)
        finally:
            stop()
    assert sorted(r[0] for r in runs) == [1] * 10 + [2] * 10
    assert all(ms >= due - 1 for attempt, ms, due in runs if attempt == 2)
    assert consumer.stats.retried == 10 and consumer.stats.handled == 10
    assert rmq.depth(queue) == 0
    assert ParkedMessage.objects.count() == 0


def test_rows_waiting_for_their_parked_commit_never_widen_the_window(rmq):
    """Thirty messages rejected (parked at once) while another connection holds the parked
    table's writes, as a database outage would: two wait for their commit and the broker
    counts two unacked, 28 ready; once writes go through all thirty are parked once."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    alpha = default_registry.find("alpha", rmq.names.prefix)
    assert alpha is not None
    queue = alpha.queue_name(rmq.names.prefix)
    for i in range(30):
        work.send({"id": i, "reject": True, "only": ["alpha"]})
    assert wait_for(lambda: rmq.depth(queue) == 30, 60)
    consumer = Consumer([alpha], consume_orphans=False, prefetch=PREFETCH)
    with _WritesHeld():
        stop = run_consumer(consumer)
        try:
            assert wait_for(lambda: consumer._parking[queue] == PREFETCH, 20)
            seen = samples(queue, 2.0)
            assert max(seen) <= PREFETCH, seen
            assert rmq.consumers(queue) == 1 and rmq.depth(queue) == 30 - PREFETCH
        except BaseException:
            stop()
            raise
    try:
        assert wait_for(lambda: ParkedMessage.objects.count() == 30, 60)
    finally:
        stop()
    assert consumer.stats.parked == 30
    assert rmq.depth(queue) == 0


@pytest.mark.parametrize("value", [-1, "8", None])
def test_a_spare_prefetch_that_is_not_a_number_from_zero_is_refused(value):
    from django_rmq_retry.checks import check_settings

    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "SPARE_PREFETCH": value}):
        errors = [e for e in check_settings() if "SPARE_PREFETCH" in e.msg]
    assert [e.id for e in errors] == ["django_rmq_retry.E005"]
