"""Quorum queues and the broker's delivery limit (issue #12), against the real broker.

RabbitMQ 4.0 gives every quorum queue a delivery limit of 20 unless told otherwise, and drops
the message past it when the queue has no dead-letter exchange. A warm shutdown gives back
every prefetched delivery whose receiver had not started, and each give-back counts: a
consumer restarted twenty-odd times with a backlog used to lose messages that never ran.

Run these against both brokers and both queue types::

    RMQ_URL=amqp://guest:guest@127.0.0.1:5682/%2F RMQ_QUEUE_TYPE=quorum pytest tests/faults/test_quorum_limits.py
    RMQ_QUEUE_TYPE=quorum pytest tests/faults/test_quorum_limits.py      # 3.10 on 5672
    pytest tests/faults/test_quorum_limits.py                             # classic

The warm-restart test runs with the configured queue type; the over-limit test is about
quorum queues only and uses them whatever is configured.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.publishing.per_thread import reset_publisher
from tests.conftest import read_log, wait_for
from tests.faults.conftest import Tally, depths, output, record, settle, spawn, stop, undeclare
from tests.testapp.events import other

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

BACKLOG = 60
RESTARTS = 25  # more than 4.0's default limit of 20, as in the issue's 22


def test_warm_restarts_with_a_backlog_lose_nothing(rmq, procs):
    """A 60-message backlog, a consumer (prefetch 50, one thread) SIGTERMed once consuming.

    Each warm shutdown finishes the receiver that started and gives back the rest of its
    prefetch window: 49 deliveries that never started. The broker serves them first to the
    next consumer, so about one message is handled per restart and the ones at positions
    22-50 are given back more than 20 times over 25 restarts. All 60 must end handled.
    """
    queue_type = str(settings.RMQ_RETRY["QUEUE_TYPE"])
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(BACKLOG):
        other.send({"id": i, "sleep": 0.3})
    tally = Tally({("gamma", i): "done" for i in range(BACKLOG)})
    for _round in range(RESTARTS):
        proc = spawn(rmq, "gamma", "--prefetch", "50", "--threads", "1", "-v", "2")
        procs.append(proc)
        # A restart as a deploy or a supervisor does it: whenever the consumer is up.
        assert wait_for(lambda p=proc: "consuming" in output(p) or p.poll() is not None, 60)
        out = stop(proc)
        assert proc.returncode == 0, out[-3000:]
        if len(tally.refresh(rmq.log).done) >= BACKLOG:
            break
    restarts = _round + 1
    done_during_restarts = len(tally.refresh(rmq.log).done)
    # Drain what is left with one consumer that keeps running.
    proc = spawn(rmq, "gamma", "--prefetch", "20", "--threads", "4")
    procs.append(proc)
    settled = settle(rmq, tally, timeout=90)
    out = stop(proc)
    record(
        f"quorum limit: {restarts} warm restarts, {BACKLOG} backlog ({queue_type})",
        published=BACKLOG,
        handled=tally.handled_ok,
        parked=tally.parked_count,
        duplicates=tally.duplicates,
        lost=len(tally.lost),
        notes=f"{done_during_restarts} handled during the restarts",
    )
    assert settled, (len(tally.lost), sorted(k[1] for k in tally.lost), depths(rmq), out[-2000:])
    assert tally.lost == []
    assert tally.wrong_outcome() == []
    assert restarts > 20 or done_during_restarts == BACKLOG


def test_a_message_past_the_brokers_delivery_limit_is_parked_not_dropped(rmq, procs):
    """A message given back more often than the quorum queue's limit ends as a parked row.

    A client that is not ours takes it and gives it back (``basic.reject`` with requeue) over
    and over, a loop our consumer cannot count. The broker dead-letters it at its limit; the
    consumer parks it under its receiver, and a requeue of that row is handled normally.
    (A reject: from 4.3 a ``basic.nack`` no longer counts toward the limit, and a nack loop
    there is not bounded by the broker at all.)
    """
    from django_rmq_retry import parking
    from django_rmq_retry.core.topology_plan import QUORUM_DELIVERY_LIMIT

    conf = {**settings.RMQ_RETRY, "QUEUE_TYPE": "quorum"}
    undeclare(rmq)  # declared by the rmq fixture with the suite's queue type
    with override_settings(RMQ_RETRY=conf):
        reset_publisher()
        try:
            call_command("rmq_consume", setup_only=True, verbosity=0)
            other.send({"id": "looped"})
            queue = rmq.queue("gamma")
            ch = rmq.ch()
            deliveries = 0
            t0 = time.monotonic()
            for _ in range(QUORUM_DELIVERY_LIMIT + 50):
                method, _props, _body = ch.basic_get(queue)
                if method is None:
                    break
                deliveries += 1
                ch.basic_reject(method.delivery_tag, requeue=True)
            looped_for = time.monotonic() - t0
            # Delivered limit + 1 times, then dead-lettered (not dropped, not kept for ever).
            assert deliveries == QUORUM_DELIVERY_LIMIT + 1, deliveries
            assert wait_for(lambda: rmq.depth(rmq.names.dead_queue) == 1, 15), depths(rmq)
            proc = spawn(rmq, "gamma", RMQ_QUEUE_TYPE="quorum")
            procs.append(proc)
            assert wait_for(lambda: ParkedMessage.objects.exists(), 60), output(proc)[-3000:]
            row = ParkedMessage.objects.get()
            assert (row.reason, row.queue) == ("delivery_limit", queue)
            assert row.receiver.endswith("gamma")
            assert f"delivery limit ({QUORUM_DELIVERY_LIMIT})" in row.reason_detail
            assert wait_for(lambda: rmq.depth(rmq.names.dead_queue) == 0, 15)
            # The operator puts it back: it reaches its receiver and is handled.
            assert parking.requeue(ParkedMessage.objects.all()).requeued == 1
            assert wait_for(
                lambda: any(
                    e["event"] == "done" and e["id"] == "looped" for e in read_log(rmq.log)
                ),
                30,
            ), output(proc)[-3000:]
            stop(proc)
            record(
                "quorum limit: message given back past the broker's limit",
                published=1,
                handled=1,
                parked=1,
                duplicates=0,
                lost=0,
                notes=f"{deliveries} deliveries in {looped_for:.1f}s, parked, requeued, handled",
            )
        finally:
            reset_publisher()
            with contextlib.suppress(Exception):  # not in the cleanup's plan when classic
                rmq.ch().queue_delete(rmq.names.dead_queue)
                rmq.ch().exchange_delete(rmq.names.dead_exchange)


def test_a_quorum_queue_declared_without_the_limit_says_how_to_migrate(rmq):
    """An existing deployment's receiver queue lacks the new arguments: nothing starts, and
    the error names the queue, the risk and the way out (RabbitMQ cannot change arguments)."""
    from django.core.management.base import CommandError

    conf = {**settings.RMQ_RETRY, "QUEUE_TYPE": "quorum"}
    undeclare(rmq)  # declared by the rmq fixture with the suite's queue type
    with override_settings(RMQ_RETRY=conf):
        queue = rmq.queue("gamma")
        rmq.ch().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            with pytest.raises(CommandError) as info:
                call_command("rmq_consume", setup_only=True, verbosity=0)
        finally:
            with contextlib.suppress(Exception):
                rmq.ch().queue_delete(rmq.names.dead_queue)
                rmq.ch().exchange_delete(rmq.names.dead_exchange)
    text = str(info.value)
    assert repr(queue) in text
    assert "older django-rmq-retry" in text and "drops a message returned 20 times" in text
    assert "delete it" in text and "--setup-only" in text


def test_a_process_killing_message_past_20_deaths_is_parked_and_spares_its_neighbours(rmq, procs):
    """``DELIVERY_LIMIT = 25``: the poison kills 25 consumers before our count parks it.

    On 4.0 without an explicit limit the broker dropped it (and every neighbour given back
    with it each time) after 20 returns, so a ``DELIVERY_LIMIT`` above 20 was never reached.
    """
    limit = 25
    conf = {**settings.RMQ_RETRY, "QUEUE_TYPE": "quorum", "DELIVERY_LIMIT": limit}
    undeclare(rmq)  # declared by the rmq fixture with the suite's queue type
    with override_settings(RMQ_RETRY=conf):
        reset_publisher()
        try:
            call_command("rmq_consume", setup_only=True, verbosity=0)
            other.send({"id": "poison", "exit": 10**6})
            for i in range(20):
                other.send({"id": i})
            deaths = 0
            for _round in range(limit + 5):
                proc = spawn(
                    rmq,
                    "gamma",
                    "--threads",
                    "1",
                    RMQ_TEST_ALLOW_EXIT="1",
                    RMQ_DELIVERY_LIMIT=str(limit),
                    RMQ_QUEUE_TYPE="quorum",
                )
                procs.append(proc)
                # Either it dies on the poison, or it lives: parked, or (before the fix, on
                # 4.0) the broker dropped the poison and the survivors are being handled.
                wait_for(lambda p=proc: p.poll() is not None or ParkedMessage.objects.exists(), 30)
                if proc.poll() is None:
                    break
                deaths += 1
            tally = Tally({("gamma", i): "done" for i in range(20)})
            tally.expected[("gamma", "poison")] = "parked"
            settled = settle(rmq, tally, timeout=60)
            out = stop(proc)
            record(
                f"quorum limit: poison with DELIVERY_LIMIT {limit} (quorum)",
                published=21,
                handled=tally.handled_ok,
                parked=tally.parked_count,
                duplicates=tally.duplicates,
                lost=len(tally.lost),
                notes=f"{deaths} process deaths",
            )
            assert settled, (tally.lost, depths(rmq), out[-2000:])
            assert tally.wrong_outcome() == []
            row = ParkedMessage.objects.get()
            assert row.reason == "delivery_limit" and f"limit {limit}" in row.reason_detail
            assert limit - 1 <= deaths <= limit, deaths  # our count, not the broker's 20
        finally:
            reset_publisher()
            with contextlib.suppress(Exception):
                rmq.ch().queue_delete(rmq.names.dead_queue)
                rmq.ch().exchange_delete(rmq.names.dead_exchange)
