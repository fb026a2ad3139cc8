"""``async def`` receivers on the consumer's event loop, against the real broker: concurrency
within its bound, retries, parking, warm shutdown and a killed consumer (lost = 0)."""

from __future__ import annotations

import importlib
import signal
from collections import Counter

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Topic
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import Registry, default_registry
from tests.conftest import read_log, start_consumer, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]
#: On the receivers' own loop (the default) and on the consumer's (``ASYNC_ON_IO_LOOP``).
ON_EITHER_LOOP = pytest.mark.parametrize("on_io_loop", [False, True], ids=["own-loop", "io-loop"])


@pytest.fixture
def aio(registry_snapshot):
    """``tests.testapp.async_consumers`` registered in this process for this test only."""
    from tests.testapp import async_consumers

    default_registry.unregister(async_consumers.delta)
    return importlib.reload(async_consumers)


def consume(count: int, idle: float = 10, **setting) -> None:
    conf = {**settings.RMQ_RETRY, **setting}
    with override_settings(RMQ_RETRY=conf):
        call_command("rmq_consume", "delta", max_messages=count, max_idle_time=idle, verbosity=0)


def most_at_once(events: list[dict]) -> int:
    """The most attempts of ``delta`` started and not yet finished at one point of the log."""
    running = peak = 0
    for e in events:
        if e["receiver"] != "delta":
            continue
        running += 1 if e["event"] == "start" else -1 if e["event"] == "done" else 0
        peak = max(peak, running)
    return peak


def test_async_receivers_run_concurrently_on_one_thread_and_stay_in_their_bound(rmq, aio):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(12):
        aio.aio_topic.send({"id": i, "sleep": 0.3})
    consume(12, ASYNC_CONCURRENCY=4, THREADS=1, PREFETCH=20)
    log = read_log(rmq.log)
    done = Counter(e["id"] for e in log if e["event"] == "done")
    assert done == Counter(range(12))
    # One receiver thread could only run them one after the other; the loop ran up to 4.
    assert most_at_once(log) == 4
    assert rmq.depth(rmq.queue("delta")) == 0


@ON_EITHER_LOOP
def test_async_receiver_retries_and_parks_like_a_plain_one(rmq, aio, on_io_loop):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    aio.aio_topic.send({"id": "once", "fail": 1})
    aio.aio_topic.send({"id": "never", "fail": "always"})
    aio.aio_topic.send({"id": "no", "reject": True})
    consume(1 + 2 + 3 + 1, ASYNC_ON_IO_LOOP=on_io_loop)  # once x2, never x3, no x1
    log = read_log(rmq.log)
    attempts = Counter(e["id"] for e in log if e["event"] == "start")
    assert attempts == {"once": 2, "never": 3, "no": 1}
    assert [e["attempt"] for e in log if e["event"] == "done"] == [2]
    parked = {r.reason: r for r in ParkedMessage.objects.all()}
    assert set(parked) == {"exhausted", "rejected"}
    assert parked["exhausted"].attempts == 3
    assert parked["exhausted"].error_type.endswith("Boom")
    assert rmq.depth(rmq.queue("delta")) == 0


@ON_EITHER_LOOP
def test_warm_shutdown_finishes_async_receivers_in_flight(rmq, aio, on_io_loop):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    total = 30
    for i in range(total):
        aio.aio_topic.send({"id": i, "sleep": 1.0})
    # 3 coroutines at once out of 10 prefetched: 7 wait for a slot when SIGTERM comes, and
    # go back to the queue untouched.
    proc = start_consumer(
        rmq.prefix,
        rmq.log,
        "delta",
        "--prefetch",
        "10",
        RMQ_TEST_ASYNC="1",
        RMQ_ASYNC_CONCURRENCY="3",
        RMQ_ASYNC_ON_IO_LOOP="1" if on_io_loop else "0",
    )
    assert wait_for(lambda: sum(e["event"] == "start" for e in read_log(rmq.log)) >= 3, 60)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    log = read_log(rmq.log)
    started = {e["id"] for e in log if e["event"] == "start"}
    done = {e["id"] for e in log if e["event"] == "done"}
    assert started and started == done  # every coroutine started was finished, then acked
    assert len(done) < total
    assert len(done) + rmq.depth(rmq.queue("delta")) == total


def test_killed_consumer_with_async_receivers_loses_nothing(rmq, aio):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    total = 40
    for i in range(total):
        aio.aio_topic.send({"id": i, "sleep": 0.5})
    proc = start_consumer(rmq.prefix, rmq.log, "delta", "--prefetch", "20", RMQ_TEST_ASYNC="1")
    assert wait_for(lambda: sum(e["event"] == "done" for e in read_log(rmq.log)) >= 3, 60)
    proc.kill()
    proc.communicate(timeout=30)
    again = start_consumer(rmq.prefix, rmq.log, "delta", "--max-idle-time", "5", RMQ_TEST_ASYNC="1")
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    done = {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}
    assert done == set(range(total))  # lost = 0 (some ran twice: at-least-once)
    assert rmq.depth(rmq.queue("delta")) == 0


def test_an_async_receiver_cannot_be_idempotent():
    async def handler(message, **kwargs):
        return None

    with pytest.raises(ImproperlyConfigured, match="async def"):
        Registry().register(handler, [Topic("test.x")], idempotent=True)
