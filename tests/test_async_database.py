"""``async def`` receivers after the database dropped their connections, on PostgreSQL.

A receiver writes through ``sync_to_async`` (Django's async ORM does the same): its calls
run on asgiref's thread for thread-sensitive code, on that thread's connection. PostgreSQL
then ends every backend of the consumer (``pg_terminate_backend`` from a connection of its
own, as a failover, a restart or an idle timeout would): each message after it must be
handled, and none parked because of the dead connection, with persistent connections
checked before reuse (the test project's ``CONN_MAX_AGE`` and ``CONN_HEALTH_CHECKS``) and
with Django's default of a connection per request (``CONN_MAX_AGE = 0``), and with the
receivers on the consumer's I/O loop (``ASYNC_ON_IO_LOOP``).
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection, connections

from django_rmq_retry import Topic
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.registry import default_registry
from tests.testapp.models import Effect
from tests.waiting import until

pytestmark = [
    pytest.mark.broker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="PostgreSQL ends the backends itself"
    ),
]


def _terminate_backends_but(keep: int) -> int:
    """End every other backend of the test database, from a connection of our own; how
    many. The test's own connection (``keep``) stays: it reads the results."""
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        ended = admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND pid <> %s",
            (settings["NAME"], keep),
        ).fetchone()
    return int(ended[0]) if ended else 0


@pytest.mark.parametrize(
    ("max_age", "on_io_loop"),
    # Per-request last: a persistent connection of asgiref's thread outlives its test (as in
    # production), and the test database cannot be dropped while it is open.
    [(300, False), (300, True), (0, False)],
    ids=["persistent", "persistent-io-loop", "per-request"],
)
def test_an_async_receiver_writes_again_after_postgres_dropped_the_connections(
    rmq, registry_snapshot, monkeypatch, settings, max_age, on_io_loop
):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", max_age)
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "ASYNC_ON_IO_LOOP": on_io_loop}
    topic = Topic("test.aiodb")

    @topic.connect
    async def aiodb(message, **kwargs):
        await sync_to_async(Effect.objects.create)(
            receiver="aiodb", key=str(message.body["id"]), attempt=message.attempt
        )

    call_command("rmq_consume", setup_only=True, verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        mine = cursor.fetchone()[0]

    def written() -> set[int]:
        return {
            int(k) for k in Effect.objects.filter(receiver="aiodb").values_list("key", flat=True)
        }

    consumer = Consumer([default_registry.find("aiodb", rmq.prefix)], relay=False)
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    try:
        for i in range(5):
            topic.send({"id": i})
        until("the first 5 messages written", lambda: written() == set(range(5)))
        ended = _terminate_backends_but(mine)
        assert ended >= 1  # the consumer's connections (its async receiver's among them)
        for i in range(5, 20):
            topic.send({"id": i})
        until("every later message written", lambda: written() == set(range(20)))
    finally:
        consumer.request_stop()
        runner.join(timeout=60)
    assert not runner.is_alive()
    assert list(ParkedMessage.objects.values_list("reason_detail", flat=True)) == []
    assert rmq.depth(rmq.queue("aiodb")) == 0
