"""``async def`` receivers on the consumer's own I/O loop (``ASYNC_ON_IO_LOOP``), against the
real broker, with the guarantees of the default loop: they run on the thread that runs the
consumer, within ``ASYNC_CONCURRENCY``; a warm shutdown out of time abandons what still
awaits (in both modes), so no attempt completes and every delivery goes back unacked.

Ordered by events (the receivers wait for the test), never by how long anything took. The
watchdog and the database-drop tests run in both modes in their own modules.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from django_rmq_retry import Topic
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import default_registry
from tests.waiting import until

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

MODES = pytest.mark.parametrize("on_io_loop", [False, True], ids=["own-loop", "io-loop"])


def _configure(settings, **extra) -> None:
    settings.RMQ_RETRY = {**django_settings.RMQ_RETRY, **extra}


def test_on_the_io_loop_they_run_on_the_consumers_thread_within_their_bound(
    rmq, registry_snapshot, settings
):
    _configure(settings, ASYNC_ON_IO_LOOP=True, ASYNC_CONCURRENCY=4)
    topic = Topic("test.ioloop")
    release = threading.Event()
    seen: list[tuple[str, int]] = []  # (thread name, running at its start)
    running = 0
    peak = 0

    @topic.connect
    async def ioloop(message, **kwargs):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        seen.append((threading.current_thread().name, running))
        while not release.is_set():
            await asyncio.sleep(0.01)
        running -= 1

    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(12):
        topic.send({"id": i})
    consumer = Consumer(
        [default_registry.find("ioloop", rmq.prefix)], prefetch=20, max_messages=12, relay=False
    )
    runner = threading.Thread(target=consumer.run, name="consumer-under-test", daemon=True)
    runner.start()
    try:
        until("the first 4 attempts running", lambda: len(seen) >= 4)
        release.set()
        runner.join(timeout=120)
    finally:
        release.set()
        consumer.request_stop()
        runner.join(timeout=60)
    assert not runner.is_alive()
    assert len(seen) == 12
    assert {name for name, _ in seen} == {"consumer-under-test"}  # the consumer's own loop
    assert peak == 4  # ASYNC_CONCURRENCY, and never more
    assert consumer.stats.handled == 12
    until("the queue empty", lambda: rmq.depth(rmq.queue("ioloop")) == 0)


@MODES
def test_a_warm_shutdown_out_of_time_abandons_what_still_awaits(
    rmq, registry_snapshot, settings, on_io_loop
):
    """Receivers that would await for ever: the warm stop ends anyway (SHUTDOWN_TIMEOUT),
    each attempt is cancelled where it awaits, none completes, nothing is acked or parked,
    and every message is back in its queue."""
    _configure(settings, ASYNC_ON_IO_LOOP=on_io_loop)
    topic = Topic("test.stuck")
    release = threading.Event()
    events: list[tuple[str, int]] = []

    @topic.connect
    async def stuck(message, **kwargs):
        events.append(("start", message.body["id"]))
        try:
            while not release.is_set():
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            events.append(("cancelled", message.body["id"]))
            raise
        events.append(("done", message.body["id"]))

    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(3):
        topic.send({"id": i})
    consumer = Consumer(
        [default_registry.find("stuck", rmq.prefix)], shutdown_timeout=1.0, relay=False
    )
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    try:
        until("3 attempts awaiting", lambda: len(events) >= 3)
        consumer.request_stop()
        runner.join(timeout=60)
        assert not runner.is_alive()  # the stop did not wait for receivers that never end
        until("every message back in its queue", lambda: rmq.depth(rmq.queue("stuck")) == 3)
    finally:
        release.set()
        consumer.request_stop()
        runner.join(timeout=60)
    assert sorted(events) == [("cancelled", i) for i in range(3)] + [("start", i) for i in range(3)]
    assert consumer.stats.done == 0
    assert not ParkedMessage.objects.exists()
    assert rmq.depth(rmq.queue("stuck")) == 3  # released: still none completed or acked
