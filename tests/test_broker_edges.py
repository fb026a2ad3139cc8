"""Publishing, connection recovery and readable errors against the real broker."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings

from django_rmq_retry import PublishError, Topic, UnroutableError
from django_rmq_retry.publishing import publisher
from django_rmq_retry.publishing.per_thread import get_publisher
from tests.conftest import rabbitmqctl_cmd, read_log, start_consumer, wait_for
from tests.testapp.events import other

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def close_connections(name: str) -> int:
    """Close every broker connection whose client-provided name is `name` (server side)."""
    out = subprocess.run(
        rabbitmqctl_cmd("-q", "list_connections", "pid", "client_properties"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    closed = 0
    for line in out.splitlines():
        if f'"{name}"' in line or f'<<"{name}">>' in line:
            pid = line.split("\t", 1)[0]
            subprocess.run(
                rabbitmqctl_cmd("-q", "close_connection", pid, "test: forced close"), check=True
            )
            closed += 1
    return closed


def test_unroutable_message_is_an_error_not_a_silent_drop(rmq):
    with pytest.raises(
        UnroutableError, match=r"no queue is bound for routing key 'nobody\.listens'"
    ):
        Topic("nobody.listens").send({"x": 1})


def test_send_reuses_one_connection_and_is_safe_in_threads(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    publisher = get_publisher()
    errors = []

    def send(start):
        try:
            for i in range(start, start + 50):
                other.send({"id": i})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(n * 50,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert get_publisher() is publisher
    assert rmq.depth(rmq.queue("gamma")) == 200


@pytest.mark.parametrize("idle_check_after", [0.0, 3600.0], ids=["polled", "not-polled"])
def test_publisher_recovers_after_its_connection_is_closed_by_the_broker(
    rmq, monkeypatch, idle_check_after
):
    # "polled": the idle check notices the dead connection before the publish; "not-polled"
    # (a busy publisher skips the check): the publish itself fails, reconnects, publishes.
    monkeypatch.setattr(publisher, "_IDLE_CHECK_AFTER", idle_check_after)
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": 1})
    name = f"django-rmq-retry publisher {rmq.prefix} pid {os.getpid()}"
    assert wait_for(lambda: close_connections(name) == 1, 60)
    # The broker's side is gone, so its close is on our socket (what the idle check reads).
    assert wait_for(lambda: close_connections(name) == 0, 30)
    other.send({"id": 2})  # reconnects by itself
    assert rmq.depth(rmq.queue("gamma")) == 2


def test_send_on_commit_waits_for_the_commit(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    with transaction.atomic():
        other.send_on_commit({"id": "committed"})
        assert rmq.depth(rmq.queue("gamma")) == 0
    assert rmq.depth(rmq.queue("gamma")) == 1
    try:
        with transaction.atomic():
            other.send_on_commit({"id": "rolled back"})
            raise RuntimeError
    except RuntimeError:
        pass
    assert rmq.depth(rmq.queue("gamma")) == 1


def test_consumer_resumes_after_its_connection_is_killed(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "-v", "2")
    try:
        for i in range(10):
            other.send({"id": i})
        assert wait_for(
            lambda: len([e for e in read_log(rmq.log) if e["event"] == "done"]) == 10, 30
        )
        name = f"django-rmq-retry consumer {rmq.prefix} pid {proc.pid}"
        assert wait_for(lambda: close_connections(name) == 1, 60)
        for i in range(10, 20):
            other.send({"id": i})
        assert wait_for(
            lambda: len({e["id"] for e in read_log(rmq.log) if e["event"] == "done"}) == 20, 60
        )
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "connection to RabbitMQ lost" in out
    assert "1 reconnect(s)" in out


def test_unreachable_broker_is_one_clear_line_without_the_password(rmq):
    url = "amqp://bob:hunter2@127.0.0.1:1/%2F"
    with override_settings(
        RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URL": url, "PREFIX": rmq.prefix}
    ):
        with pytest.raises(CommandError) as info:
            call_command("rmq_consume", "gamma", fail_fast=True, verbosity=0)
        with pytest.raises(PublishError) as pub:
            from django_rmq_retry.publishing.publisher import Publisher

            Publisher().send_bodies("x", [{}])
    assert (pub.value.confirmed, len(pub.value.failed)) == ([], 1)  # nothing was published
    for text in (str(info.value), str(pub.value)):
        assert "cannot reach RabbitMQ at amqp://bob:***@127.0.0.1:1/%2F" in text
        assert "hunter2" not in text


def test_wrong_password_is_reported_as_such(rmq):
    url = "amqp://guest:wrong@127.0.0.1:5672/%2F"
    with (
        override_settings(
            RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URL": url, "PREFIX": rmq.prefix}
        ),
        pytest.raises(CommandError, match="refused the login"),
    ):
        call_command("rmq_consume", "gamma", verbosity=0)


@pytest.mark.undeclared  # the queue is declared here first, with other arguments
def test_queue_declared_elsewhere_with_other_arguments_is_named(rmq):
    rmq.ch().queue_declare(rmq.queue("gamma"), durable=True, arguments={"x-max-length": 10})
    with pytest.raises(CommandError) as info:
        call_command("rmq_consume", "gamma", max_idle_time=1, verbosity=0)
    text = str(info.value)
    # The broker names the first argument that differs: with quorum queues that is one of
    # ours (x-queue-type, the dead-letter exchange, ...) before x-max-length.
    differing = "x-max-length" if settings.RMQ_RETRY["QUEUE_TYPE"] == "classic" else "arg 'x-"
    assert rmq.queue("gamma") in text and differing in text, text
    assert "Traceback" not in text


def test_list_shows_receivers_queues_and_the_retry_topology(rmq, capsys):
    call_command("rmq_consume", "gamma", list=True)
    out = capsys.readouterr().out
    assert "tests.testapp.consumers.gamma" in out
    assert rmq.queue("gamma") in out
    assert "10 attempts" in out
    assert f"{rmq.prefix}.delay.00: TTL 0.1s → {rmq.prefix}.deliver" in out
    assert "guest:***@" in out and "guest:guest" not in out


def test_unknown_receiver_is_a_clear_error(rmq):
    with pytest.raises(CommandError, match="Unknown receiver 'nope'"):
        call_command("rmq_consume", "nope")
