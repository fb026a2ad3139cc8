"""A message the broker refuses for what it carries is not an outage (the real broker).

Among good messages, one carries a ``user_id`` that is not the connection's login (RabbitMQ
closes the channel: 406 PRECONDITION_FAILED) or properties too large for a frame (RabbitMQ
closes the connection: 501 FRAME_ERROR). Every confirmed-publish path finds it, counts it
and deals with it: ``send``/``send_many`` raise naming it, the outbox holds its row, a
requeue keeps its row parked with the reason; the good messages are each published once
(duplicates counted), in order, none lost.

Each case runs twice: refused before it is sent ("early": what can be known beforehand is),
and with that check off ("broker"), so the broker's own refusal is what the publisher must
tell from an outage (it finds the culprit by publishing the unanswered ones one by one).
"""

from __future__ import annotations

import importlib
import json
from collections import Counter
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_rmq_retry import PublishError, parking
from django_rmq_retry.broker import confirms
from django_rmq_retry.core.errors import MessageRefused
from django_rmq_retry.models import OutboxMessage, OutboxStatus, ParkedMessage
from django_rmq_retry.outbox import publish_all
from django_rmq_retry.publishing import per_thread, publisher
from tests.testapp.events import other

#: The requeue module (``parking.requeue`` is the function of the same name).
requeue_module = importlib.import_module("django_rmq_retry.parking.requeuing")

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

#: Properties of the culprit, per kind of refusal.
BAD = {
    "user_id": {"user_id": "mallory"},
    "frame": {"headers": {"padding": "x" * 140_000}},  # > frame_max (131072)
}


@pytest.fixture(params=["early", "broker"])
def where(request, monkeypatch):
    """``broker``: the early check off, so the broker's refusal is what gets found."""
    if request.param == "broker":
        monkeypatch.setattr(confirms, "early_refusal", lambda *a, **k: "")
    return request.param


def _counted(rmq, queue: str) -> tuple[list[Any], Counter[Any]]:
    ids = [json.loads(body)["id"] for _m, _p, body in rmq.get_all(queue)]
    return ids, Counter(ids)


def _first_seen(ids: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    return [i for i in ids if not (i in seen or seen.add(i))]


@pytest.mark.parametrize("bad", sorted(BAD))
def test_send_raises_at_once_naming_the_message_and_the_publisher_goes_on(rmq, where, bad):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": "before"})
    with pytest.raises(MessageRefused) as info:
        other.send({"id": "culprit"}, message_id="culprit-1", **_kwargs(bad))
    assert "'culprit-1'" in str(info.value)  # named, with why
    assert ("user_id" if bad == "user_id" else "frame") in str(info.value).lower()
    assert info.value.confirmed == []
    other.send({"id": "after"})  # the same thread's publisher works on
    ids, _count = _counted(rmq, rmq.queue("gamma"))
    assert ids == ["before", "after"]


@pytest.mark.parametrize("bad", sorted(BAD))
def test_send_many_refuses_the_culprit_and_publishes_the_others_once(rmq, where, bad):
    """``send_many``'s pipeline (``Publisher.send_items``) with the culprit in the middle of
    one batch (``send_many`` itself shares one set of properties: its items are built here)."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    items = publisher.outgoing("test.other", [{"id": i} for i in range(50)])
    culprit = publisher.outgoing("test.other", [{"id": "culprit"}], **_kwargs(bad))[0]
    items.insert(25, culprit)
    with pytest.raises(MessageRefused) as info:
        per_thread.get_publisher().send_items(items)
    assert repr(culprit.message_id) in str(info.value)
    assert info.value.failed == [culprit.message_id]
    assert len(info.value.confirmed) == 50
    ids, count = _counted(rmq, rmq.queue("gamma"))
    duplicates = sum(n - 1 for n in count.values())
    print(f"send_many {where}/{bad}: published={len(count)} duplicates={duplicates}")
    assert _first_seen(ids) == list(range(50))  # each good one stored, in order
    assert duplicates <= (0 if where == "early" else 25)  # bounded: those before it, once


def test_send_many_refuses_a_body_over_the_maximum_message_size_and_sends_the_rest(rmq, settings):
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "MAX_MESSAGE_BYTES": 1000}
    call_command("rmq_consume", setup_only=True, verbosity=0)
    bodies: list[dict[str, Any]] = [{"id": i} for i in range(20)]
    bodies.insert(10, {"id": "big", "pad": "x" * 2000})
    with pytest.raises(MessageRefused, match="maximum message size of 1000") as info:
        other.send_many(bodies)
    assert len(info.value.confirmed) == 20 and len(info.value.failed) == 1
    assert _counted(rmq, rmq.queue("gamma"))[0] == list(range(20))


def _kwargs(bad: str) -> dict[str, Any]:
    return dict(BAD[bad])


@pytest.mark.parametrize("bad", sorted(BAD))
def test_outbox_holds_the_culprit_and_publishes_every_good_row_once_in_order(
    rmq, settings, where, bad
):
    """Issue's case: the relay retried "broker unavailable" for ever, published no later
    row, and re-published the earlier ones each round."""
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "OUTBOX_PUBLISH_ON_COMMIT": False}
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with transaction.atomic():
        for i in range(40):
            other.send({"id": i}, outbox=True)
        other.send({"id": "culprit"}, outbox=True, **_kwargs(bad))
        for i in range(40, 80):
            other.send({"id": i}, outbox=True)
    total = publish_all()
    again = publish_all()  # nothing left to publish: the culprit is held, not retried
    ids, count = _counted(rmq, rmq.queue("gamma"))
    published = len(count)
    duplicates = sum(n - 1 for n in count.values())
    lost = [i for i in range(80) if i not in count]
    held = OutboxMessage.objects.get()
    print(
        f"outbox {where}/{bad}: published={published} held={total.held} "
        f"duplicates={duplicates} lost={len(lost)}"
    )
    assert (published, lost, "culprit" in count) == (80, [], False)
    assert _first_seen(ids) == list(range(80))  # the transaction's order kept
    assert duplicates <= (0 if where == "early" else 40)  # bounded: one window, once
    assert (total.published, total.held, total.refused) == (80, 1, 1)
    assert (again.published, again.refused) == (0, 0)
    assert held.status == OutboxStatus.HELD
    assert "refused by the broker" in held.last_error
    assert ("user_id" if bad == "user_id" else "frame") in held.last_error.lower()


@pytest.mark.parametrize("bad", ["frame"])  # a copy carries user_id in a header of ours
def test_requeue_keeps_the_culprit_parked_with_the_reason_and_requeues_the_others(
    rmq, where, bad, monkeypatch
):
    if where == "broker":  # the requeue's own frame check off too: the broker refuses it
        monkeypatch.setattr(requeue_module, "properties_room", lambda frame_max: 10**9)
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("gamma")
    rows = []
    for i in range(30):
        props = {"content_type": "application/json", "message_id": f"m{i}"}
        if i == 10:
            props.update(_kwargs(bad))
        rows.append(
            ParkedMessage(
                park_key=f"{rmq.prefix}-{i}",
                receiver="r",
                queue=queue,
                exchange=rmq.names.work_exchange,
                routing_key="test.other",
                message_id=f"m{i}",
                body=json.dumps({"id": i}).encode(),
                body_size=10,
                content_type="application/json",
                properties=props,
                headers=props.get("headers", {}),
                reason="exhausted",
                attempts=3,
                parked_at=timezone.now(),
            )
        )
    ParkedMessage.objects.bulk_create(rows)
    result = parking.requeue(ParkedMessage.objects.all(), user="t")
    _ids, count = _counted(rmq, queue)
    duplicates = sum(n - 1 for n in count.values())
    print(
        f"requeue {where}/{bad}: requeued={result.requeued} failed={result.failed} "
        f"duplicates={duplicates}"
    )
    assert (result.requeued, result.failed) == (29, 1), result
    assert sorted(count) == [i for i in range(30) if i != 10]
    assert duplicates <= (0 if where == "early" else 10)
    culprit = ParkedMessage.objects.get(message_id="m10")
    assert culprit.status == "parked"
    assert culprit.history[-1]["event"] == "requeue refused", culprit.history
    assert "frame" in culprit.history[-1]["reason"]
    assert any(e.startswith(f"#{culprit.pk}: ") and "frame" in e for e in result.errors)
    assert ParkedMessage.objects.filter(status="requeued").count() == 29
    again = parking.requeue(ParkedMessage.objects.all(), user="t")  # the culprit alone
    assert (again.requeued, again.failed) == (0, 1)
    assert rmq.get_all(queue) == []  # nothing else sent again, nothing stored


def test_send_refuses_a_body_over_the_maximum_message_size_before_sending(rmq, settings):
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "MAX_MESSAGE_BYTES": 1000}
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with pytest.raises(MessageRefused, match="maximum message size of 1000"):
        other.send({"id": "big", "pad": "x" * 2000})
    other.send({"id": "small"})
    assert _counted(rmq, rmq.queue("gamma"))[0] == ["small"]
    assert isinstance(MessageRefused("x"), PublishError)  # callers catching PublishError


def test_a_message_to_an_exchange_refused_with_403_is_found_and_the_rest_flow(rmq, settings):
    """An exchange the broker refuses publishes to (here an internal one: 403
    ACCESS_REFUSED, as for an exchange the login may not write to): nothing says so
    beforehand, so the broker's refusal is what the publisher finds, in send_many's pipeline
    and in the outbox relay (a row whose exchange is that one is held, the others flow)."""
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "OUTBOX_PUBLISH_ON_COMMIT": False}
    call_command("rmq_consume", setup_only=True, verbosity=0)
    internal = f"{rmq.prefix}.internal"
    rmq.ch().exchange_declare(internal, "topic", internal=True, auto_delete=True)
    items = publisher.outgoing("test.other", [{"id": i} for i in range(20)])
    culprit = publisher.outgoing("test.other", [{"id": "culprit"}], exchange=internal)[0]
    items.insert(10, culprit)
    with pytest.raises(MessageRefused, match="403") as info:
        per_thread.get_publisher().send_items(items)
    assert info.value.failed == [culprit.message_id]
    ids, count = _counted(rmq, rmq.queue("gamma"))
    assert _first_seen(ids) == list(range(20))
    assert sum(count.values()) - len(count) <= 10  # duplicates: those before it, once

    with transaction.atomic():
        for i in range(5):
            other.send({"id": f"r{i}"}, outbox=True)
        bad_row = other.send({"id": "row-culprit"}, outbox=True)
        for i in range(5, 10):
            other.send({"id": f"r{i}"}, outbox=True)
    assert OutboxMessage.objects.filter(message_id=bad_row.message_id).update(exchange=internal)
    total = publish_all()
    ids, count = _counted(rmq, rmq.queue("gamma"))
    print(
        f"403 outbox: published={len(count)} held={total.held} dups={sum(count.values()) - len(count)}"
    )
    assert _first_seen(ids) == [f"r{i}" for i in range(10)]
    held = OutboxMessage.objects.get()
    assert held.status == OutboxStatus.HELD and "403" in held.last_error
    assert (total.published, total.held) == (10, 1)


def test_a_search_that_outlasts_the_heartbeat_keeps_the_connection(rmq, monkeypatch):
    """The search for a refused message is timers on the publisher's loop, which the
    waiting thread runs: heartbeats are served while it lasts (here a second per suspect,
    well past the two missed 2 s heartbeats after which RabbitMQ drops a silent peer), so the
    connection that carried the batch is the one still open after it."""
    from django_rmq_retry.broker import window
    from django_rmq_retry.publishing.publisher import Publisher
    from tests.conftest import BROKER_URL

    monkeypatch.setattr(window, "ISOLATION_STEP_PAUSE", 1.0)
    monkeypatch.setattr(confirms, "early_refusal", lambda *a, **k: "")  # the broker finds it
    queue = f"{rmq.prefix}.heartbeat"
    rmq.ch().queue_declare(queue, auto_delete=True)
    publisher = Publisher(f"{BROKER_URL}?heartbeat=2", declare=False)
    try:
        publisher.send_items([confirms.Outgoing("", queue, b"warm", {"message_id": "warm"})])
        link = publisher._link
        items = [
            confirms.Outgoing("", queue, json.dumps({"id": i}).encode(), {"message_id": f"m{i}"})
            for i in range(8)
        ]
        culprit = confirms.Outgoing("", queue, b"{}", {"message_id": "bad", "user_id": "mallory"})
        items.insert(2, culprit)
        with pytest.raises(MessageRefused, match="'bad'"):
            publisher.send_items(items)
        assert publisher._link is link and link.is_open  # never dropped, never replaced
        assert [item.message_id for item in items if not item.confirmed] == ["bad"]
    finally:
        publisher.close()
    stored = [props.message_id for _m, props, _b in rmq.get_all(queue)]
    rmq.ch().queue_delete(queue)
    assert _first_seen(stored) == ["warm"] + [f"m{i}" for i in range(8)]
    assert all(stored.count(f"m{i}") <= 2 for i in range(8))
