"""An ``async def`` receiver that blocks its event loop is named while it blocks.

``time.sleep`` inside ``async def`` stops every other coroutine on the consumer's event loop.
The watchdog (``consumer.watchdog``) names the receiver in a WARNING, with its line, while it
still sleeps, and liveness fails while it has blocked the loop for longer than the liveness
timeout; both clear once the loop turns again, whether the loop is the receivers' own or
the consumer's I/O loop (``ASYNC_ON_IO_LOOP``). Tested by the order of events (the receiver
sleeps until the test has seen them), never by how long anything took.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.core.management import call_command

from django_rmq_retry import Topic, hooks
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.consumer.watchdog import LoopWatchdog, blocker, receiver_codes
from django_rmq_retry.registry import default_registry
from tests.waiting import until


def _warned(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("on_io_loop", [False, True], ids=["own-loop", "io-loop"])
def test_a_receiver_blocking_the_loop_is_named_and_fails_liveness_while_it_blocks(
    rmq, registry_snapshot, caplog, settings, on_io_loop
):
    """On the receivers' own loop, and on the consumer's I/O loop (``ASYNC_ON_IO_LOOP``),
    where the WARNING says the broker I/O waits too."""
    from django_rmq_retry import observability

    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "ASYNC_ON_IO_LOOP": on_io_loop}
    caplog.set_level(logging.INFO, logger="django_rmq_retry")
    topic = Topic("test.blocking")
    release = threading.Event()
    events: list[str] = []

    @topic.connect
    async def sleeper(message, **kwargs):
        events.append("sleeping")
        while not release.is_set():
            time.sleep(0.05)  # blocks the event loop, as a synchronous call would
        events.append("woke")

    call_command("rmq_consume", setup_only=True, verbosity=0)
    observer = observability.enable(metrics=False, tracing=False, liveness_timeout=1.0)
    health = observer.health
    consumer = Consumer([default_registry.find("sleeper", rmq.prefix)], relay=False)
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    try:
        topic.send({"id": 1})
        until("the WARNING naming the receiver", lambda: _warned(caplog, "blocks the event loop"))
        assert events == ["sleeping"]  # it still sleeps
        (warning,) = _warned(caplog, "blocks the event loop")
        assert warning.startswith("async receiver ") and "sleeper blocks the event loop" in warning
        assert f"{__file__}:" in warning  # its own line
        assert ("broker I/O" in warning) is on_io_loop  # what waits on that loop
        until("liveness fails while it blocks", lambda: not health.live())
        assert events == ["sleeping"] and health.blocked_by is not None
        assert health.blocked_by.endswith("sleeper")

        release.set()
        until("the receiver woke", lambda: events == ["sleeping", "woke"])
        # Two signals of their own: the loop's heartbeat (live) and the watchdog's next
        # look at the loop (the blocker named no more); on a loaded host one comes first.
        until("live again", health.live)
        until("the blocker no longer named", lambda: health.blocked_by is None)
        until("the all clear", lambda: _warned(caplog, "let the event loop go"))
    finally:
        release.set()
        consumer.request_stop()
        runner.join(timeout=60)
        observer.stopped()
        observability.disable()
    assert not runner.is_alive()
    assert hooks.current is None


def test_the_blocker_is_the_innermost_receiver_on_the_stack():
    async def outer_receiver(message, **kwargs):
        return inner()

    def inner():
        return blocker(_frame(), codes)

    def _frame():
        import sys

        return sys._getframe(1)

    class Rec:
        func = outer_receiver
        name = "app.outer_receiver"

    codes = receiver_codes([Rec])
    coroutine = outer_receiver(None)
    try:
        coroutine.send(None)
    except StopIteration as stop:
        name, filename, line = stop.value
    assert name == "app.outer_receiver" and filename == __file__ and line > 0
    assert blocker(None, codes) == (None, "?", 0)


def test_a_loop_that_turns_is_never_reported(caplog):
    """The check itself, on a stamp the test sets: fresh stamps say nothing; a stale one
    names the blocker once, however often it is seen, then clears."""
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        dog = LoopWatchdog(loop, {}, "t")
        now = time.monotonic()
        dog._stamp = now
        with caplog.at_level(logging.INFO, logger="django_rmq_retry"):
            dog.check(now + 0.1)
            assert caplog.records == []
            dog.check(now + 2)
            dog.check(now + 3)
            assert len(_warned(caplog, "blocks the event loop")) == 1
            dog._stamp = now + 3
            dog.check(now + 3.05)
            assert len(_warned(caplog, "let the event loop go after 3.0s")) == 1
    finally:
        loop.close()
