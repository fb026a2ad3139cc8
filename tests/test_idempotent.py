"""Idempotent receivers (``@receiver(..., idempotent=True)``) on the real broker and database:
a message delivered twice has its effect once, a failed attempt's effect rolls back, a message
without an id is keyed on its content, and old inbox rows are purged."""

from __future__ import annotations

from datetime import timedelta

import pika
import pytest
from django.core.management import call_command
from django.utils import timezone

from django_rmq_retry.consumer.inbox import message_key
from django_rmq_retry.models import InboxEntry
from django_rmq_retry.testing import InMemoryBroker
from tests.conftest import BROKER_URL, read_log
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]

RECEIVER = "tests.faults.dbapp.consumers.writes_effect"


def consume(n: int) -> None:
    call_command("rmq_consume", RECEIVER, max_messages=n, max_idle_time=10, verbosity=0)


def effect_rows() -> list[tuple[str, int]]:
    return list(Effect.objects.order_by("key", "attempt").values_list("key", "attempt"))


@pytest.mark.broker
def test_a_message_delivered_twice_has_its_effect_once(rmq, effects):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    effects.send({"id": "a"}, message_id="m-1")
    effects.send({"id": "a"}, message_id="m-1")  # the same message again (a sender's retry)
    effects.send({"id": "b"}, message_id="m-2")
    consume(3)
    assert effect_rows() == [("a", 1), ("b", 1)]
    starts = [e["id"] for e in read_log(rmq.log) if e["event"] == "start"]
    assert sorted(starts) == ["a", "b"]  # the duplicate was acked without running
    assert rmq.depth(rmq.queue(RECEIVER)) == 0
    assert set(InboxEntry.objects.values_list("receiver", "key")) == {
        (RECEIVER, "m-1"),
        (RECEIVER, "m-2"),
    }


@pytest.mark.broker
def test_a_failed_attempt_s_effect_rolls_back_with_its_inbox_row(rmq, effects):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    effects.send({"id": "c", "fail": 2})
    consume(3)  # attempt 1 and 2 fail after writing, attempt 3 commits
    assert effect_rows() == [("c", 3)]
    assert InboxEntry.objects.count() == 1


@pytest.mark.broker
def test_a_message_without_an_id_is_keyed_on_its_route_and_body(rmq, effects):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        ch = conn.channel()
        for _ in range(2):  # a foreign client's message, twice, with no message_id
            ch.basic_publish(
                rmq.names.work_exchange,
                "faults.effects",
                b'{"id": "d"}',
                pika.BasicProperties(content_type="application/json"),
            )
    finally:
        conn.close()
    consume(2)
    assert effect_rows() == [("d", 1)]
    key = InboxEntry.objects.get().key
    assert key == message_key(None, "faults.effects", b'{"id": "d"}')
    assert key.startswith("sha256:")


def test_in_memory_broker_keeps_effects_once_too(effects):
    with InMemoryBroker() as broker:
        effects.send({"id": "e"}, message_id="m-e")
        effects.send({"id": "e"}, message_id="m-e")
        effects.send({"id": "f", "fail": 1}, message_id="m-f")
        runs = broker.run_until_idle()
    assert effect_rows() == [("e", 1), ("f", 2)]
    assert [r.outcome for r in runs].count("handled") == 3  # the duplicate is acked as handled


def test_old_inbox_rows_are_purged_by_the_command(effects):
    old = timezone.now() - timedelta(days=8)
    InboxEntry.objects.create(receiver=RECEIVER, key="old", handled_at=old)
    InboxEntry.objects.create(receiver=RECEIVER, key="new", handled_at=timezone.now())
    call_command("rmq_purge_inbox", dry_run=True, verbosity=0)
    assert InboxEntry.objects.count() == 2
    call_command("rmq_purge_inbox", verbosity=0)  # INBOX_RETENTION_DAYS = 7
    assert list(InboxEntry.objects.values_list("key", flat=True)) == ["new"]
    call_command("rmq_purge_inbox", older_than="0", verbosity=0)
    assert InboxEntry.objects.count() == 0
