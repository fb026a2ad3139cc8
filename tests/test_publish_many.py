"""``Topic.send_many`` (and ``send``): one pipeline: pipelined confirms, counted on the broker.

Every test counts what actually reached the queues: a batch that reports success must have
stored every message, and a batch that fails must say exactly which messages were confirmed.
"""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from django_rmq_retry import PublishError
from django_rmq_retry.broker import Outgoing
from django_rmq_retry.conf import app_settings
from django_rmq_retry.core.errors import NackedError, UnroutableError
from django_rmq_retry.publishing.per_thread import get_publisher
from django_rmq_retry.publishing.publisher import BATCH_WINDOW
from tests.testapp.events import other, work

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def _ids(messages) -> list[str]:
    return [props.message_id for _m, props, _b in messages]


def test_batch_larger_than_the_window_is_stored_once_each(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    n = BATCH_WINDOW * 2 + 345  # several windows, the last one partial
    results = work.send_many([{"id": i} for i in range(n)])
    assert len(results) == n
    assert len({r.message_id for r in results}) == n
    for short in ("alpha", "beta"):  # both receivers of the topic get every message once
        got = rmq.get_all(rmq.queue(short))
        assert sorted(_ids(got)) == sorted(r.message_id for r in results)
    assert rmq.depth(rmq.queue("gamma")) == 0


def test_results_keep_input_order_and_bodies(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    results = other.send_many([{"id": i} for i in range(50)], headers={"h": "v"})
    got = rmq.get_all(rmq.queue("gamma"))
    assert _ids(got) == [r.message_id for r in results]  # one channel: order is kept
    assert [b for _m, _p, b in got] == [f'{{"id":{i}}}'.encode() for i in range(50)]
    assert all(p.headers == {"h": "v"} and p.delivery_mode == 2 for _m, p, _b in got)


def test_empty_batch_publishes_nothing(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    assert work.send_many([]) == []
    assert rmq.depth(rmq.queue("alpha")) == 0


def test_unroutable_batch_raises_and_confirms_nothing(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with pytest.raises(UnroutableError) as info:
        get_publisher().send_bodies("nobody.listens", [{"id": i} for i in range(30)])
    assert info.value.confirmed == []
    assert len(info.value.failed) == 30
    assert "30 message(s) were returned" in str(info.value)
    # The publisher still works afterwards.
    other.send_many([{"id": 1}])
    assert rmq.depth(rmq.queue("gamma")) == 1


def test_unroutable_messages_inside_a_batch_are_the_ones_reported(rmq):
    """Returns are matched to their own message, even interleaved with routable ones."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    publisher = get_publisher()
    publisher._ensure_connection()
    exchange = rmq.names.work_exchange
    items = []
    for i in range(40):
        key = "test.other" if i % 3 else "nobody.listens"
        props = {"message_id": f"m{i}", "delivery_mode": 2}
        items.append(Outgoing(exchange, key, b"{}", props))
    with pytest.raises(UnroutableError) as info:
        publisher.send_items(items)
    unroutable = {f"m{i}" for i in range(40) if i % 3 == 0}
    assert set(info.value.failed) == unroutable
    assert {r.message_id for r in info.value.confirmed} == {f"m{i}" for i in range(40)} - unroutable
    stored = _ids(rmq.get_all(rmq.queue("gamma")))
    assert sorted(stored) == sorted(r.message_id for r in info.value.confirmed)


def _bounded_queue(rmq, length: int) -> str:
    queue = f"{rmq.prefix}.bounded"
    ch = rmq.ch()
    ch.queue_declare(
        queue, arguments={"x-max-length": length, "x-overflow": "reject-publish"}, auto_delete=True
    )
    ch.queue_bind(queue, rmq.names.work_exchange, routing_key="bounded.key")
    return queue


def test_nacked_messages_are_reported_and_only_confirmed_ones_stored(rmq, settings):
    """A full queue with overflow=reject-publish nacks: exactly the stored ones are confirmed."""
    # The nacks last: 1 s of pauses, not the default 20 (the wait has a test of its own).
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "PUBLISH_NACK_WAIT": 1}
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _bounded_queue(rmq, 7)
    try:
        with pytest.raises(PublishError) as info:
            get_publisher().send_bodies("bounded.key", [{"id": i} for i in range(25)])
        assert not isinstance(info.value, UnroutableError)
        assert "nacked" in str(info.value)
        assert len(info.value.confirmed) == 7
        assert len(info.value.failed) == 18
        stored = _ids(rmq.get_all(queue))
        assert sorted(stored) == sorted(r.message_id for r in info.value.confirmed)
    finally:
        rmq.ch().queue_delete(queue)


def test_missing_exchange_raises_and_the_publisher_recovers(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    publisher = get_publisher()
    publisher._ensure_connection()  # connects and declares now
    rmq.ch().exchange_delete(rmq.names.work_exchange)
    with pytest.raises(PublishError) as info:
        work.send_many([{"id": i} for i in range(5)])
    assert "404" in str(info.value)
    assert info.value.confirmed == []
    call_command("rmq_consume", setup_only=True, verbosity=0)  # declare it again
    assert len(work.send_many([{"id": i} for i in range(5)])) == 5
    assert rmq.depth(rmq.queue("alpha")) == 5


def test_a_body_that_is_not_json_publishes_nothing(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with pytest.raises(TypeError):
        other.send_many([{"id": 1}, {"id": object()}])
    assert rmq.depth(rmq.queue("gamma")) == 0


def test_single_and_batch_sends_mix_on_one_publisher(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": 0})
    other.send_many([{"id": i} for i in range(1, 11)])
    other.send({"id": 11})
    other.send_many([{"id": i} for i in range(12, 20)])
    bodies = [b for _m, _p, b in rmq.get_all(rmq.queue("gamma"))]
    assert bodies == [f'{{"id":{i}}}'.encode() for i in range(20)]


def test_a_nack_that_passes_is_published_again_and_stored_once(rmq, monkeypatch):
    """A nack is the broker unable to store *now* (a leader moving, a full queue): send and
    send_many publish the nacked message again after a pause; once room is made, it is stored
    exactly once and the call returns normally."""
    from django_rmq_retry.publishing import publisher as publisher_module

    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _bounded_queue(rmq, 3)
    publisher = get_publisher()
    drained: list = []

    def make_room(_pause: float) -> None:  # the pause is when the queue gets consumed
        drained.extend(rmq.get_all(queue))

    monkeypatch.setattr(publisher_module, "_pause", make_room)
    try:
        publisher.send_bodies("bounded.key", [{"id": i} for i in range(3)])  # fills it
        single = publisher.send_bodies("bounded.key", [{"id": "single"}])[0]
        assert len(drained) == 3  # one pause: the queue was full once
        batch = publisher.send_bodies("bounded.key", [{"id": i} for i in range(3, 8)])
        stored = _ids(drained) + _ids(rmq.get_all(queue))
        expected = [single.message_id, *(r.message_id for r in batch)]
        assert sorted(stored[3:]) == sorted(expected)  # each once, none lost
        assert len(stored) == 3 + 1 + 5
    finally:
        rmq.ch().queue_delete(queue)


def test_a_nack_that_lasts_raises_after_the_bounded_pauses(rmq, monkeypatch):
    from django_rmq_retry.publishing import publisher

    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _bounded_queue(rmq, 1)
    pauses: list[float] = []
    monkeypatch.setattr(publisher, "_pause", pauses.append)
    try:
        first = get_publisher().send_bodies("bounded.key", [{"id": 0}])[0]
        with pytest.raises(NackedError):
            get_publisher().send_bodies("bounded.key", [{"id": 1}])[0]
        assert pauses == list(publisher.nack_pauses())
        assert sum(pauses) == pytest.approx(app_settings.PUBLISH_NACK_WAIT)
        assert _ids(rmq.get_all(queue)) == [first.message_id]
    finally:
        rmq.ch().queue_delete(queue)


def test_the_wait_for_a_nack_to_pass_is_a_setting_and_really_waited(rmq, settings, timed_pauses):
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "PUBLISH_NACK_WAIT": 1.5}
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = _bounded_queue(rmq, 1)
    try:
        first = get_publisher().send_bodies("bounded.key", [{"id": 0}])[0]
        t0 = time.monotonic()
        with pytest.raises(NackedError):
            get_publisher().send_bodies("bounded.key", [{"id": 1}])[0]
        waited = time.monotonic() - t0
        # Pauses of 0.5 s and 1 s, three publishes refused: counted, and really waited (a
        # lower bound only: a loaded host may take longer, never shorter).
        assert [seconds for _at, seconds in timed_pauses] == [0.5, 1.0]
        assert waited >= 1.5
        assert _ids(rmq.get_all(queue)) == [first.message_id]
    finally:
        rmq.ch().queue_delete(queue)
