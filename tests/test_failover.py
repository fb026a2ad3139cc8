"""BROKER_URLS: connections try a cluster's nodes in turn and move on after a lost one."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import broker
from django_rmq_retry.conf import broker_urls
from django_rmq_retry.core.errors import BrokerUnavailable
from django_rmq_retry.core.failover import connect_order
from django_rmq_retry.publishing.publisher import Publisher
from tests.conftest import BROKER_URL, read_log, start_consumer, wait_for
from tests.test_broker_edges import close_connections
from tests.testapp.events import other

A, B, C = "amqp://a/%2F", "amqp://b/%2F", "amqp://c/%2F"
DEAD = "amqp://guest:guest@127.0.0.1:1/%2F"
# Two spellings of the one real broker, so a test can tell which URL a connection used.
FIRST, SECOND = f"{BROKER_URL}?connection_attempts=1", f"{BROKER_URL}?connection_attempts=2"


def test_connect_order_starts_after_the_lost_url_and_tries_it_last():
    assert connect_order([A, B, C]) == [A, B, C]
    assert connect_order([A, B, C], after=A) == [B, C, A]
    assert connect_order([A, B, C], after=C) == [A, B, C]
    assert connect_order([A, B, C], after="amqp://gone/%2F") == [A, B, C]
    assert connect_order([A], after=A) == [A]


def test_broker_urls_default_to_broker_url_and_refuse_a_string():
    with override_settings(RMQ_RETRY={"BROKER_URL": A}):
        assert broker_urls() == [A]
    with override_settings(RMQ_RETRY={"BROKER_URL": A, "BROKER_URLS": [B, C]}):
        assert broker_urls() == [B, C]
    with (
        override_settings(RMQ_RETRY={"BROKER_URLS": f"{A},{B}"}),
        pytest.raises(ImproperlyConfigured, match="BROKER_URLS"),
    ):
        broker_urls()


@pytest.mark.broker
def test_connect_skips_a_node_that_does_not_answer(broker_ok):
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URLS": [DEAD, FIRST]}):
        conn = broker.connect()
        assert conn.url == FIRST
        conn.close()
        conn = broker.connect(after=FIRST)  # the dead one first, then around to FIRST
        assert conn.url == FIRST
        conn.close()
    with (
        override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URLS": [DEAD, DEAD]}),
        pytest.raises(BrokerUnavailable, match=r"cannot reach RabbitMQ at .*127\.0\.0\.1:1/"),
    ):
        broker.connect()


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_publisher_moves_to_the_next_url_after_a_lost_connection(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URLS": [FIRST, SECOND]}):
        publisher = Publisher()
        publisher.send_bodies("test.other", [{"id": 1}])
        assert publisher._link is not None and publisher._link.url == FIRST
        publisher._link.close()  # as if its node went away
        publisher.send_bodies("test.other", [{"id": 2}])
        assert publisher._link.url == SECOND
        publisher.close()
    assert rmq.depth(rmq.queue("gamma")) == 2


def done(rmq) -> set[int]:
    return {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_consumer_reconnects_to_the_next_url(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "-v", "2", RMQ_URLS=f"{FIRST},{SECOND}")
    try:
        other.send({"id": 1})
        assert wait_for(lambda: done(rmq) == {1}, 30)
        name = f"django-rmq-retry consumer {rmq.prefix} pid {proc.pid}"
        assert wait_for(lambda: close_connections(name) == 1, 60)
        other.send({"id": 2})
        assert wait_for(lambda: done(rmq) == {1, 2}, 30)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    first, second = (
        line for line in out.splitlines() if "consuming" in line and "queue(s) on" in line
    )
    assert "connection_attempts=1" in first, out
    assert "connection_attempts=2" in second, out
