"""A publisher never blocks its neighbours: one thread's ``send`` completes while another
thread waits out nack pauses on a full queue, while a requeue does, and while a relay round
is publishing (the real broker).

Each test proves the order, not a speed: the other thread is held *inside* its wait (its
pause, or its round) until the ``send`` has returned; only then is it let go. With one
process-wide publisher lock the ``send`` could not return before that, and the test fails
after its guard instead of hanging. Every message is counted where it landed: published
once, none lost.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections, transaction
from django.utils import timezone

from django_rmq_retry import Topic, parking
from django_rmq_retry.models import OutboxMessage, ParkedMessage
from django_rmq_retry.outbox import publish_pending, relay
from django_rmq_retry.publishing import per_thread, publisher
from django_rmq_retry.publishing.publisher import PublishResult
from tests.testapp.events import other

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

#: Seconds a test waits for the neighbour's send before it calls it blocked (a hang guard,
#: not a speed target: the send takes milliseconds when nothing holds it up).
GUARD = 30
bounded = Topic("bounded.key")


def _bounded_queue(rmq, length: int) -> str:
    queue = f"{rmq.prefix}.bounded"
    ch = rmq.ch()
    ch.queue_declare(
        queue, arguments={"x-max-length": length, "x-overflow": "reject-publish"}, auto_delete=True
    )
    ch.queue_bind(queue, rmq.names.work_exchange, routing_key="bounded.key")
    return queue


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``work`` on a thread of its own; its result (or exception) lands in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # reported by the test
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


class HeldPause:
    """``publisher._pause`` made to hold its thread until released: a thread in it is
    provably inside a nack pause."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.taken = 0

    def __call__(self, _seconds: float) -> None:
        self.taken += 1
        self.entered.set()
        assert self.release.wait(120), "the test never let the pause go"


def _send_beside(
    held: threading.Event, release: threading.Event
) -> tuple[list[Any], threading.Thread, bool]:
    """``other.send`` on a thread of its own while another thread is held; whether it
    returned before that one was let go."""
    assert held.wait(GUARD), "the neighbour never reached its wait"
    sender, outcome = _in_thread(lambda: other.send({"id": "neighbour"}))
    sender.join(GUARD)
    done_first = not sender.is_alive() and not release.is_set()
    return outcome, sender, done_first


def _ids(rmq, queue: str) -> list[str]:
    return [json.loads(body)["id"] for _m, _p, body in rmq.get_all(queue)]


def test_a_send_completes_while_another_thread_waits_out_nack_pauses(rmq, monkeypatch):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _bounded_queue(rmq, 1)
    pause = HeldPause()
    monkeypatch.setattr(publisher, "_pause", pause)
    try:
        bounded.send({"id": "filler"})  # the queue is full: the next publish is nacked
        stuck, stuck_outcome = _in_thread(lambda: bounded.send({"id": "stuck"}))
        outcome, sender, done_first = _send_beside(pause.entered, pause.release)
        drained = _ids(rmq, queue)  # room made while the stuck thread still pauses
        pause.release.set()
        sender.join(GUARD)
        stuck.join(GUARD)
        assert done_first, "the send waited for another thread's nack pause"
        assert isinstance(outcome[0], PublishResult), outcome
        assert isinstance(stuck_outcome[0], PublishResult), stuck_outcome
        # Counted: each message stored once, where it belongs; none lost.
        assert _ids(rmq, rmq.queue("gamma")) == ["neighbour"]
        assert drained + _ids(rmq, queue) == ["filler", "stuck"]
        assert pause.taken == 1
    finally:
        pause.release.set()
        rmq.ch().queue_delete(queue)


def test_a_send_completes_while_a_requeue_waits_out_nack_pauses(rmq, monkeypatch):
    """An admin requeue into a full queue (its copies nacked) pauses with a thread of the
    web worker; a ``send`` of another request goes through meanwhile."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _bounded_queue(rmq, 2)  # the filler and one copy
    pause = HeldPause()
    monkeypatch.setattr(publisher, "_pause", pause)
    ParkedMessage.objects.bulk_create(
        [
            ParkedMessage(
                park_key=f"{rmq.prefix}-{i}",
                receiver="r",
                queue=queue,
                exchange=rmq.names.work_exchange,
                routing_key="bounded.key",
                message_id=f"p{i}",
                body=json.dumps({"id": f"parked-{i}"}).encode(),
                body_size=20,
                content_type="application/json",
                properties={"content_type": "application/json", "message_id": f"p{i}"},
                headers={},
                reason="exhausted",
                attempts=3,
                parked_at=timezone.now(),
            )
            for i in range(2)
        ]
    )
    try:
        bounded.send({"id": "filler"})
        requeue, requeue_outcome = _in_thread(
            lambda: parking.requeue(ParkedMessage.objects.all(), user="t", mode="topic")
        )
        outcome, sender, done_first = _send_beside(pause.entered, pause.release)
        drained = _ids(rmq, queue)  # the filler and the first copy: room for the second
        pause.release.set()
        sender.join(GUARD)
        requeue.join(GUARD)
        assert done_first, "the send waited for a requeue's nack pause"
        assert isinstance(outcome[0], PublishResult), outcome
        result = requeue_outcome[0]
        assert (result.requeued, result.failed) == (2, 0), result
        assert _ids(rmq, rmq.queue("gamma")) == ["neighbour"]
        assert sorted(drained + _ids(rmq, queue)) == ["filler", "parked-0", "parked-1"]
        assert ParkedMessage.objects.filter(status="requeued").count() == 2
    finally:
        pause.release.set()
        rmq.ch().queue_delete(queue)


def test_a_send_completes_while_a_relay_round_publishes(rmq, monkeypatch, settings):
    """A relay round is held between reading its rows and publishing them (its stream is
    open on its publisher); a ``send`` on another thread goes through meanwhile, and the
    round then publishes every row once."""
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "OUTBOX_PUBLISH_ON_COMMIT": False}
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with transaction.atomic():
        rows = other.send_many([{"id": f"row-{i}"} for i in range(20)], outbox=True)
    entered, release = threading.Event(), threading.Event()
    real = relay._overtaking

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert release.wait(120), "the test never let the round go"
        return real(*args, **kwargs)

    monkeypatch.setattr(relay, "_overtaking", held)
    try:
        round_thread, round_outcome = _in_thread(publish_pending)
        outcome, sender, done_first = _send_beside(entered, release)
        release.set()
        sender.join(GUARD)
        round_thread.join(GUARD)
        assert done_first, "the send waited for a relay round"
        assert isinstance(outcome[0], PublishResult), outcome
        assert round_outcome[0].published == len(rows), round_outcome
        got = _ids(rmq, rmq.queue("gamma"))
        assert sorted(got) == sorted(["neighbour", *(f"row-{i}" for i in range(20))])
        assert OutboxMessage.objects.count() == 0
    finally:
        release.set()


def test_each_thread_has_its_own_connection_closed_when_the_thread_ends(rmq):
    """As Django's database connections: a publisher per thread, its connection closed by
    the thread's end (not left open for the process's lifetime, nor shared)."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    seen: list[Any] = []

    def send() -> None:
        other.send({"id": "from-thread"})
        seen.append(per_thread.get_publisher()._link)

    thread, outcome = _in_thread(send)
    thread.join(GUARD)
    other.send({"id": "from-main"})
    mine = per_thread.get_publisher()._link
    assert outcome == [None]
    assert seen[0] is not mine
    assert not seen[0].is_open  # closed as its thread ended
    assert mine.is_open
    assert sorted(_ids(rmq, rmq.queue("gamma"))) == ["from-main", "from-thread"]
