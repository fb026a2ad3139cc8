"""``Publisher.stream_batches``: batch after batch in one stream of confirms (the requeue's
path), on the real broker. Every test counts what reached the queue: each batch is handed
back once, in order, with each item's final answer, and what was confirmed is stored once.
Connection losses mid-stream: ``tests/faults/test_broker_faults.py`` (scenario 8)."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from django_rmq_retry.broker import Outgoing
from django_rmq_retry.core.errors import PublishError
from django_rmq_retry.publishing import publisher
from django_rmq_retry.publishing.publisher import Publisher

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def _queue(rmq, length: int | None = None) -> str:
    queue = f"{rmq.prefix}.batches"
    args = {"x-max-length": length, "x-overflow": "reject-publish"} if length else {}
    rmq.ch().queue_declare(queue, arguments=args, auto_delete=True)
    return queue


def _batches(queue: str, sizes: list[int]) -> list[list[Outgoing]]:
    """Batches for ``queue`` (default exchange) of the given sizes, ids ``b<batch>-<item>``."""
    return [
        [
            Outgoing(
                "", queue, f"{b}-{i}".encode(), {"message_id": f"b{b}-{i}", "delivery_mode": 2}
            )
            for i in range(size)
        ]
        for b, size in enumerate(sizes)
    ]


def _stored_ids(rmq, queue: str) -> list[str]:
    return [props.message_id for _m, props, _b in rmq.get_all(queue)]


def test_batches_are_handed_back_in_order_each_answered_and_stored_once(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _queue(rmq)
    batches = _batches(queue, [30, 0, 1, 250, 7, 120, 64, 3] + [5] * 30)
    answered: list[list[Outgoing]] = []
    in_flight: list[int] = []

    def source():
        for number, batch in enumerate(batches):
            if number % 10 == 0:
                yield None  # "nothing yet": answers keep coming meanwhile
            in_flight.append(number - len(answered))  # batches given, not yet handed back
            yield batch

    def on_answered(batch):
        assert all(item.confirmed for item in batch)  # every item has its final answer
        answered.append(batch)

    try:
        Publisher(declare=False).stream_batches(source(), on_answered, window=100, most=2)
        assert [id(b) for b in answered] == [id(b) for b in batches]  # each once, in order
        assert max(in_flight) <= 2  # never more than `most` batches in flight
        expected = [item.message_id for batch in batches for item in batch]
        assert sorted(_stored_ids(rmq, queue)) == sorted(expected)  # 625, none twice
    finally:
        rmq.ch().queue_delete(queue)


def test_a_nack_mid_stream_is_published_again_and_stored_once(rmq, monkeypatch):
    """The queue holds 50: its nacks end the stream, the nacked items are published again
    after a pause (the queue drained meanwhile) and the stream goes on with the rest."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _queue(rmq, 50)
    drained: list[str] = []
    monkeypatch.setattr(publisher, "_pause", lambda _s: drained.extend(_stored_ids(rmq, queue)))
    batches = _batches(queue, [40] * 6)
    answered: list[list[Outgoing]] = []
    try:
        Publisher(declare=False).stream_batches(iter(batches), answered.append, window=30)
        assert [id(b) for b in answered] == [id(b) for b in batches]
        assert all(item.confirmed for batch in batches for item in batch)
        stored = drained + _stored_ids(rmq, queue)
        assert len(drained) > 0  # there were nacks, and pauses
        assert sorted(stored) == sorted(item.message_id for b in batches for item in b)
    finally:
        rmq.ch().queue_delete(queue)


def test_a_nack_that_lasts_is_an_answer_after_the_bounded_pauses(rmq, monkeypatch):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _queue(rmq, 5)
    pauses: list[float] = []
    monkeypatch.setattr(publisher, "_pause", pauses.append)
    batches = _batches(queue, [4, 4, 4])
    answered: list[list[Outgoing]] = []
    try:
        Publisher(declare=False).stream_batches(iter(batches), answered.append, window=100)
        assert [id(b) for b in answered] == [id(b) for b in batches]
        items = [item for batch in batches for item in batch]
        assert [item.state for item in items].count("ack") == 5
        assert [item.state for item in items].count("nack") == 7  # answered: refused
        assert sorted(_stored_ids(rmq, queue)) == sorted(i.message_id for i in items if i.confirmed)
        # Each batch with nacks got nack_pauses() at most (three batches).
        assert 0 < len(pauses) <= 3 * len(publisher.nack_pauses())
    finally:
        rmq.ch().queue_delete(queue)


def test_a_deadline_cuts_the_pauses_after_nacks_and_leaves_the_rest_nacked(rmq, virtual_pauses):
    """With ``deadline`` no pause after a nack ends past it (``PUBLISH_NACK_WAIT`` is 20 s
    here): what is still nacked then is the answer, and every batch is handed back."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _queue(rmq, 5)
    batches = _batches(queue, [4, 4, 4])
    answered: list[list[Outgoing]] = []
    try:
        deadline = virtual_pauses.now + 1.2  # the pauses' own clock: 0.5 s fits, 1 s not
        Publisher(declare=False).stream_batches(
            iter(batches), answered.append, window=100, deadline=deadline
        )
        assert [id(b) for b in answered] == [id(b) for b in batches]
        items = [item for batch in batches for item in batch]
        assert [item.state for item in items].count("ack") == 5
        assert [item.state for item in items].count("nack") == 7
        assert virtual_pauses.pauses
        assert all(start + seconds <= deadline for start, seconds in virtual_pauses.pauses)
        assert sorted(_stored_ids(rmq, queue)) == sorted(i.message_id for i in items if i.confirmed)
    finally:
        rmq.ch().queue_delete(queue)


def test_an_error_of_the_source_is_raised_after_what_was_in_flight_is_answered(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _queue(rmq)
    batches = _batches(queue, [100, 100])
    answered: list[list[Outgoing]] = []

    def source():
        yield from batches
        raise RuntimeError("the database went away")

    try:
        with pytest.raises(RuntimeError, match="went away"):
            Publisher(declare=False).stream_batches(source(), answered.append, window=500)
        assert [id(b) for b in answered] == [id(b) for b in batches]
        assert all(item.confirmed for batch in batches for item in batch)
        assert len(_stored_ids(rmq, queue)) == 200
    finally:
        rmq.ch().queue_delete(queue)


def test_an_unreachable_broker_raises_without_looping(rmq):
    answered: list[list[Outgoing]] = []
    publisher = Publisher("amqp://guest:guest@127.0.0.1:1/%2F", declare=False)  # nothing listens
    with pytest.raises(PublishError):
        publisher.stream_batches(iter(_batches("q", [3, 3])), answered.append)
    assert answered == []  # nothing was taken from the source, nothing to hand back


def test_a_source_waiting_on_a_broker_that_stopped_answering_times_out(rmq, monkeypatch):
    """A stream whose source yields "nothing yet" while a confirm never comes ends as a
    stall after STALL_TIMEOUT (as a full window does), instead of waiting forever."""
    from django_rmq_retry.broker import window as window_module
    from django_rmq_retry.broker.wire import Encoded

    monkeypatch.setattr(window_module, "STALL_TIMEOUT", 0.3)
    publisher = Publisher(declare=False)
    publisher._ensure_connection()
    driver = publisher._driver
    window = driver._window_now()
    # One publish the broker will never answer: a tag it never saw.
    never = Outgoing("", "q", b"", {"message_id": "x"})
    window._pending[10**9] = window_module._Entry(never, lambda item: None, Encoded(b"", "x"))

    gave_up: list[bool] = []

    def waiting_forever():  # (gives up after 60 s, so that a missing stall clock fails, not hangs)
        while time.monotonic() - t0 < 60:
            yield None
        gave_up.append(True)

    t0 = time.monotonic()
    try:
        outcome = driver.run(waiting_forever(), window=10)
        assert outcome.timed_out
        # The stall clock ended the run, not the source: it was still waiting (order, not a
        # wall-clock window a loaded host could miss), and not before STALL_TIMEOUT.
        assert not gave_up
        assert time.monotonic() - t0 >= 0.3
        assert never.state == ""  # no answer: stored or not is unknown
    finally:
        publisher.close()


def test_an_error_of_answered_closes_the_channel_whose_confirms_were_pending(rmq):
    """``answered`` raising (a requeue's marks failing) leaves confirms pending: that
    pipeline is never used again, so its channel is closed instead of staying open beside
    the next one until the connection closes; the publisher goes on with a new one."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _queue(rmq)
    publisher = Publisher(declare=False)
    try:
        publisher.stream_batches(iter(_batches(queue, [5])), lambda batch: None)
        first = publisher._driver.window
        assert first is not None and first.state == "normal"

        def fails(batch):
            raise RuntimeError("the marks failed")

        with pytest.raises(RuntimeError, match="marks failed"):
            publisher.stream_batches(iter(_batches(queue, [500, 500, 500])), fails, most=2)
        assert publisher._driver.window is None
        assert first.state == "closed"  # its channel closed: not left open beside the next
        answered: list[list[Outgoing]] = []
        later = _batches(queue, [10])
        publisher.stream_batches(iter(later), answered.append)
        assert [id(b) for b in answered] == [id(b) for b in later]
        assert all(item.confirmed for item in later[0])
        # 5 + the 500 handed back (and at most the 500 after it, already written) + 10
        assert 515 <= len(_stored_ids(rmq, queue)) <= 1015
    finally:
        publisher.close()
        rmq.ch().queue_delete(queue)
