"""Retries through the broker's delay levels, counted end to end against the real broker."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Retry, Topic
from django_rmq_retry.models import ParkedMessage, RetryPolicy
from tests.conftest import read_log, start_consumer, wait_for
from tests.testapp.events import other, work

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def consume(*receivers: str, **opts) -> None:
    """``rmq_consume`` in this process until ``max_messages`` deliveries, whenever they come
    (a generous idle time only ends a count that never comes: it fails, not hangs), or
    without a count until 3 s idle."""
    opts.setdefault("max_idle_time", 60 if opts.get("max_messages") else 3)
    call_command("rmq_consume", *receivers, verbosity=0, **opts)


def starts(log, receiver=None):
    return Counter(
        e["id"]
        for e in read_log(log)
        if e["event"] == "start" and receiver in (None, e["receiver"])
    )


def delay_queue_depth(rmq) -> int:
    from django_rmq_retry.conf import current_levels

    return sum(rmq.depth(rmq.names.delay_queue(k)) for k in range(current_levels().levels))


def test_always_failing_message_is_handled_exactly_max_attempts_times_then_parked(rmq):
    """gamma allows 10 attempts; 5 messages → 50 handlings, 5 parked rows, queues empty."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(5):
        other.send({"id": i, "fail": "always"})
    consume("gamma", max_messages=50)  # a retry's delay is no race: the count waits for it
    assert starts(rmq.log, "gamma") == {i: 10 for i in range(5)}
    parked = ParkedMessage.objects.order_by("id")
    assert parked.count() == 5
    assert {p.attempts for p in parked} == {10}
    assert {p.reason for p in parked} == {"exhausted"}
    assert {p.error_type for p in parked} == {"tests.testapp.consumers.Boom"}
    assert rmq.depth(rmq.queue("gamma")) == 0
    assert delay_queue_depth(rmq) == 0
    assert rmq.depth(rmq.names.orphan_queue) == 0


@pytest.mark.parametrize("fail", [1, 2])
def test_transient_failures_recover_and_siblings_never_rerun(rmq, fail):
    """alpha fails `fail` times; beta (same topic, own queue) must run exactly once."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(10):
        work.send({"id": i, "fail": fail, "only": ["alpha"]})
    consume("alpha", "beta", max_messages=10 * (fail + 1) + 10)
    assert starts(rmq.log, "alpha") == {i: fail + 1 for i in range(10)}
    assert starts(rmq.log, "beta") == {i: 1 for i in range(10)}
    done = Counter((e["receiver"], e["id"]) for e in read_log(rmq.log) if e["event"] == "done")
    assert set(done.values()) == {1} and len(done) == 20
    assert ParkedMessage.objects.count() == 0


def test_a_float_header_read_from_a_message_can_be_sent_on(rmq, registry_snapshot):
    """A receiver reads a foreign double as a float; sending those headers on (pika 1.4
    refuses floats) reaches the next receiver with the same floats, its retry copy too."""
    inbound, onward = Topic("test.floats.in"), Topic("test.floats.out")
    seen: list[tuple[int, dict]] = []

    @inbound.connect
    def forward(message, **kwargs):
        onward.send({"n": 1}, headers=dict(message.headers))

    @onward.connect
    def capture(message, **kwargs):
        seen.append((message.attempt, dict(message.headers)))
        if message.attempt == 1:
            raise ValueError("first attempt fails")

    rmq.setup()
    rmq.ch().basic_publish(
        rmq.names.work_exchange,
        "test.floats.in",
        b'{"n": 1}',
        pika.BasicProperties(content_type="application/json", headers={"tenant": "acme"}),
    )
    # A double as a Java client writes it: pika 1.4 cannot encode one, so the raw table.
    rmq.ch().basic_publish(
        rmq.names.work_exchange,
        "test.floats.in",
        b'{"n": 2}',
        _with_double_header("ratio", 2.5),
    )
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "DELAY_LANDING_MS": 0}):
        consume("forward", "capture", max_messages=6)
    ratios = sorted((attempt, h.get("ratio", -1.0)) for attempt, h in seen)
    assert ratios == [(1, -1.0), (1, 2.5), (2, -1.0), (2, 2.5)]
    assert all(type(r) is float for _, r in ratios)
    assert ParkedMessage.objects.count() == 0


def _with_double_header(key: str, value: float) -> pika.BasicProperties:
    """Properties whose header table holds ``key`` as an AMQP double (type ``d``)."""
    import struct

    from django_rmq_retry.broker.wire import Encoded
    from tests.faults.rawamqp import shortstr, table

    flags = struct.pack(">H", (1 << 15) | (1 << 13))  # content_type, headers
    return Encoded(flags + shortstr("application/json") + table({key: value}), None)


def test_retry_copy_preserves_body_and_every_property(rmq, registry_snapshot):
    topic = Topic("test.props")
    seen = []

    @topic.connect
    def capture(message, **kwargs):
        seen.append(message)
        if message.attempt == 1:
            raise ValueError("first attempt fails")

    call_command("rmq_consume", setup_only=True, verbosity=0)
    body = b'{"z": 1, "a": [1, 2, 3], "s": "\\u00e9"}  '  # exact bytes, odd spacing kept
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=2,
        priority=7,
        correlation_id="corr-1",
        reply_to="replies",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="order.paid",
        app_id="shop",
        headers={"tenant": "acme", "nested": {"k": [1, "two"]}, "n": 5},
    )
    rmq.ch().basic_publish(rmq.names.work_exchange, "test.props", body, props)
    # No landing: the policy's 0.1 s retry would otherwise be held by the consumer whole and
    # cross no delay level (tests/test_landing.py has the copy that lands early).
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "DELAY_LANDING_MS": 0}):
        consume("capture", max_messages=2)
    assert [m.attempt for m in seen] == [1, 2]
    first, second = seen
    assert second.raw == body == first.raw
    for key in (
        "content_type",
        "content_encoding",
        "priority",
        "correlation_id",
        "reply_to",
        "message_id",
        "timestamp",
        "type",
        "app_id",
        "delivery_mode",
    ):
        assert second.properties[key] == first.properties[key], key
    for key, value in first.headers.items():
        assert second.headers[key] == value
    h = rmq.names.header
    assert second.headers[h("attempt")] == 2
    assert second.headers[h("error-type")] == "ValueError"
    assert second.headers[h("error")] == "first attempt fails"
    assert second.headers[h("original-routing-key")] == "test.props"
    assert second.routing_key == "test.props" and second.exchange == rmq.names.work_exchange
    # The only x-death entries are the ones the broker added on this trip through our delay
    # levels: the copy we published carried none.
    deaths = second.headers.get("x-death", [])
    assert deaths and all(d["queue"].startswith(rmq.names.prefix + ".delay.") for d in deaths)
    assert all(d["count"] == 1 for d in deaths)


def test_routing_is_exact_even_when_queue_names_are_suffixes(rmq, registry_snapshot):
    """Retries address one queue by exact header match: 'orders' never gets 'x.orders' retries."""
    topic = Topic("test.exact")
    calls = Counter()

    def make(name, fail):
        def handler(message, **kwargs):
            calls[name] += 1
            if fail and message.attempt == 1:
                raise ValueError("once")

        handler.__qualname__ = f"exact_{name.replace('.', '_')}"
        return handler

    topic.connect(make("orders", False), queue="orders")
    topic.connect(make("x.orders", True), queue="x.orders")
    topic.connect(make("orders.x", True), queue="orders.x")
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for _ in range(5):
        topic.send({"n": 1})
    consume("orders", "x.orders", "orders.x", max_messages=5 + 10 + 10)
    assert calls == {"orders": 5, "x.orders": 10, "orders.x": 10}


def test_short_delays_never_wait_behind_long_ones(rmq):
    """30 s retries published first must not hold up 1 s retries (no head-of-line blocking)."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    for i in range(5):
        other.send({"id": f"long{i}", "fail": 1, "retry_delay": 30})
    for i in range(5):
        other.send({"id": f"short{i}", "fail": 1, "retry_delay": 1})
    # Ten first attempts, then the first five second attempts to come back, whenever: were
    # the short ones held behind the long ones, those five would be the long ones, 30 s on.
    consume("gamma", max_messages=15)
    second = [e for e in read_log(rmq.log) if e["event"] == "start" and e["attempt"] == 2]
    assert sorted(e["id"] for e in second) == [f"short{i}" for i in range(5)]
    first_fail = {
        e["id"]: e["t"] for e in read_log(rmq.log) if e["event"] == "start" and e["attempt"] == 1
    }
    lateness = [e["t"] - first_fail[e["id"]] - 1.0 for e in second]
    assert min(lateness) >= 0, lateness  # never before their time
    assert delay_queue_depth(rmq) == 5  # the long ones are still waiting in the levels


def test_retry_whose_queue_vanished_is_parked_as_orphaned(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": "lost?", "fail": 1, "retry_delay": 1})
    consume("gamma", max_messages=1)  # fails once: the copy waits 1 s in the delay levels
    gamma_queue = rmq.queue("gamma")
    rmq.ch().queue_delete(gamma_queue)
    assert wait_for(lambda: rmq.depth(rmq.names.orphan_queue) == 1, timeout=60)
    consume("gamma", max_idle_time=1.5)
    row = ParkedMessage.objects.get()
    assert row.reason == "orphaned"
    assert row.receiver == "tests.testapp.consumers.gamma"
    assert row.queue == gamma_queue
    assert row.routing_key == "test.other"
    assert rmq.depth(rmq.names.orphan_queue) == 0


def test_reject_and_undecodable_park_at_once(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": "r", "reject": True})
    props = pika.BasicProperties(
        content_type="application/json", delivery_mode=2, message_id="bad-json"
    )
    rmq.ch().basic_publish(rmq.names.work_exchange, "test.other", b"{not json", props)
    consume("gamma", max_idle_time=1.5)
    assert starts(rmq.log, "gamma") == {"r": 1}  # undecodable never reaches the receiver
    rows = {p.reason: p for p in ParkedMessage.objects.all()}
    assert set(rows) == {"rejected", "undecodable"}
    assert rows["undecodable"].message_id == "bad-json"
    assert "not valid JSON" in rows["undecodable"].error_message
    assert bytes(rows["undecodable"].body) == b"{not json"
    assert rows["rejected"].attempts == 1


def test_retry_policy_row_applies_to_a_running_consumer(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    proc = start_consumer(rmq.prefix, rmq.log, "gamma")
    try:
        other.send({"id": "before", "fail": "always"})
        assert wait_for(
            lambda: ParkedMessage.objects.filter(message_id__isnull=False).count() == 1, 30
        )
        assert ParkedMessage.objects.get().attempts == 10
        RetryPolicy.objects.create(
            receiver="tests.testapp.consumers.gamma",
            max_attempts=2,
            initial_delay=0.1,
            max_delay=0.1,
            jitter="none",
        )
        time.sleep(1.5)  # POLICY_CACHE_SECONDS is 1 in the test settings
        other.send({"id": "after", "fail": "always"})
        assert wait_for(lambda: ParkedMessage.objects.count() == 2, 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert starts(rmq.log, "gamma") == {"before": 10, "after": 2}


def test_receiver_can_ask_for_a_delay(rmq, registry_snapshot):
    topic = Topic("test.steer")
    times = []

    @topic.connect
    def steer(message, **kwargs):
        times.append(time.monotonic())
        if message.attempt == 1:
            raise Retry("not yet", delay=1.5)

    call_command("rmq_consume", setup_only=True, verbosity=0)
    topic.send({})
    consume("steer", max_messages=2)
    assert len(times) == 2
    assert times[1] - times[0] >= 1.4  # the receiver's 1.5 s (due in whole ms), not 0.1 s


@pytest.mark.parametrize("queue_type", ["quorum"])
@pytest.mark.undeclared  # declared here, with quorum queues
def test_quorum_queues_count_exactly_too(rmq, queue_type):
    from django.conf import settings

    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "QUEUE_TYPE": queue_type}):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        args = rmq.ch().queue_declare(rmq.queue("gamma"), passive=True)
        assert args.method.queue == rmq.queue("gamma")
        for i in range(3):
            other.send({"id": i, "fail": "always"})
        consume("gamma", max_messages=30)
    assert starts(rmq.log, "gamma") == {i: 10 for i in range(3)}
    assert ParkedMessage.objects.filter(attempts=10).count() == 3
