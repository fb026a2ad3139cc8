"""The consumer's handler on plain data: a delivery in, an action out.

No broker and no database (these tests have no ``django_db`` mark: a query would fail
them). Every decision the consumer takes per delivery is reachable from here: run or park
before running, the retry's route and due time, the failure story of a parked row.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from django_rmq_retry.consumer.actions import Ack, Delivery, PublishRetry, StorePark
from django_rmq_retry.consumer.handler import Handler
from django_rmq_retry.core.backoff import Policy
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.envelope import UNDECODABLE_HEADERS, UndecodableHeaders
from django_rmq_retry.core.errors import Reject, Retry
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.outcome import Park, ParkReason
from django_rmq_retry.core.undecodable import RAW_HEADERS
from django_rmq_retry.registry import Receiver, Registry, TopicKey

NAMES = Names("p")
LEVELS = DelayLevels(100, 23)
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
NOW_MS = int(NOW.timestamp() * 1000)
POLICY = Policy(max_attempts=3, initial_delay=1.0, multiplier=2.0, max_delay=60, jitter="none")


class Calls:
    """A receiver that records what it was given and does what it is told."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.raise_: BaseException | None = None

    def __call__(self, message: Any, **kwargs: Any) -> None:
        self.messages.append((message, kwargs))
        if self.raise_ is not None:
            raise self.raise_


@pytest.fixture
def receiver() -> tuple[Receiver, Calls]:
    calls = Calls()
    calls.__module__ = "shop.consumers"  # type: ignore[attr-defined]
    calls.__qualname__ = "invoice"  # type: ignore[attr-defined]
    rec = Registry().register(calls, [TopicKey("shop.order.paid")])
    return rec, calls


class FakeLimits:
    """The delivery-limit bookkeeping's interface, without the database."""

    def __init__(self, over: Park | None = None) -> None:
        self.over = over
        self.checked: list[Delivery] = []
        self.forgotten: list[str | None] = []

    def applies(self, d: Delivery, headers: Any) -> bool:
        return d.redelivered

    def check(self, d: Delivery, headers: Any) -> tuple[str | None, Park | None]:
        self.checked.append(d)
        return "start-key", self.over

    def forget(self, keys: Any) -> None:
        self.forgotten.extend(keys)


def handler(limits: Any = None) -> Handler:
    return Handler(
        NAMES,
        LEVELS,
        limits=limits,
        policy_for=lambda rec: POLICY,
        clock=lambda: NOW,
        rng=random.Random(0),
    )


def delivery(rec: Receiver | None, body: bytes = b'{"order_id": 42}', **overrides: Any) -> Delivery:
    headers = overrides.pop("headers", {})
    props = {
        "content_type": "application/json",
        "message_id": "m-1",
        "delivery_mode": 2,
        "headers": headers,
        **overrides.pop("properties", {}),
    }
    values: dict[str, Any] = {
        "queue": rec.queue_name("p") if rec else NAMES.orphan_queue,
        "receiver": rec,
        "exchange": "p.work",
        "routing_key": "shop.order.paid",
        "redelivered": False,
        "properties": props,
        "body": body,
    }
    values.update(overrides)
    return Delivery(**values)


def test_a_receiver_that_returns_is_acked_with_the_decoded_message(receiver):
    rec, calls = receiver
    action = handler().handle(delivery(rec))
    assert action == Ack()
    (message, kwargs) = calls.messages[0]
    assert message.body == {"order_id": 42} and message.attempt == 1
    assert message.routing_key == "shop.order.paid" and message.queue == "p.shop.consumers.invoice"
    assert kwargs["receiver"] is rec and kwargs["topic"] == TopicKey("shop.order.paid")


def test_a_failure_is_routed_through_the_delay_levels_with_its_due_time(receiver):
    rec, calls = receiver
    calls.raise_ = ValueError("warehouse down")
    action = handler().handle(delivery(rec))
    assert isinstance(action, PublishRetry)
    # 1 s = 10 units of 100 ms = binary 1010: the copy enters level 3 and waits in 3 and 1.
    assert action.exchange == "p.delay.03"
    assert action.routing_key == ".".join(["0"] * 19 + ["1", "0", "1", "0"])
    headers = action.properties["headers"]
    assert headers["p-attempt"] == 2 and headers["p-due"] == NOW_MS + 1000
    assert headers["p-due-us"] == (NOW_MS + 1000) * 1000
    assert headers["p-target"] == "p.shop.consumers.invoice"
    assert headers["p-error-type"] == "ValueError" and headers["p-error"] == "warehouse down"
    assert headers["p-original-routing-key"] == "shop.order.paid"
    assert action.body == b'{"order_id": 42}' and action.signal_kwargs["delay"] == 1.0


def test_a_retry_of_a_retry_keeps_its_original_route_and_first_failure(receiver):
    rec, calls = receiver
    calls.raise_ = ValueError("still down")
    first = (NOW - timedelta(minutes=5)).isoformat()
    retried = delivery(
        rec,
        exchange="p.deliver",
        routing_key="0.0.0",
        headers={
            "p-attempt": 2,
            "p-first-failure": first,
            "p-original-exchange": "p.work",
            "p-original-routing-key": "shop.order.paid",
        },
    )
    action = handler().handle(retried)
    assert isinstance(action, PublishRetry)
    headers = action.properties["headers"]
    assert headers["p-attempt"] == 3
    assert datetime.fromisoformat(headers["p-first-failure"]) == datetime.fromisoformat(first)
    assert headers["p-due"] == NOW_MS + 2000  # second retry: 2 s
    assert calls.messages[0][0].routing_key == "shop.order.paid"


def test_the_last_attempt_parks_with_the_whole_failure_story(receiver):
    rec, calls = receiver
    calls.raise_ = ValueError("gave up")
    first = NOW - timedelta(minutes=3)
    action = handler().handle(
        delivery(
            rec,
            exchange="p.deliver",  # a retry copy: its headers count (see test_envelope)
            headers={"p-attempt": 3, "p-first-failure": first.isoformat()},
        )
    )
    assert isinstance(action, StorePark)
    req = action.request
    assert req.reason == ParkReason.EXHAUSTED.value and req.attempts == 3
    assert req.reason_detail == "failed 3 times (max attempts 3)"
    assert req.receiver == "shop.consumers.invoice" and req.queue == "p.shop.consumers.invoice"
    assert req.error_type == "ValueError" and req.error_message == "gave up"
    assert "ValueError: gave up" in req.traceback
    assert req.fingerprint.startswith("ValueError at ")
    assert req.first_failure_at == first and req.last_failure_at == NOW


def test_retry_with_no_delay_skips_the_levels(receiver):
    rec, calls = receiver
    calls.raise_ = Retry("now", delay=0)
    action = handler().handle(delivery(rec))
    assert isinstance(action, PublishRetry)
    assert action.exchange == "p.deliver" and set(action.routing_key.split(".")) == {"0"}


def test_reject_parks_at_once(receiver):
    rec, calls = receiver
    calls.raise_ = Reject("no sku")
    action = handler().handle(delivery(rec))
    assert isinstance(action, StorePark) and action.request.reason == "rejected"
    assert action.request.reason_detail == "no sku"


def test_an_undecodable_body_parks_before_the_receiver_runs(receiver):
    rec, calls = receiver
    action = handler().handle(delivery(rec, body=b"{not json"))
    assert isinstance(action, StorePark) and action.request.reason == "undecodable"
    assert "not valid JSON" in action.request.reason_detail
    assert calls.messages == []


def test_undecodable_headers_park_the_body_without_them_but_keep_their_bytes(receiver):
    rec, calls = receiver
    raw = b"\x00\x00\x00\x0a\x04bornT\xff\xff"
    marked = UndecodableHeaders(
        {UNDECODABLE_HEADERS: "headers nested too deeply to decode", RAW_HEADERS: raw}
    )
    action = handler().handle(delivery(rec, headers=marked))
    assert isinstance(action, StorePark) and action.request.reason == "undecodable"
    assert action.request.reason_detail.startswith("headers nested too deeply to decode; ")
    assert action.request.properties["headers"] == {}
    assert action.request.properties[RAW_HEADERS] == raw
    assert calls.messages == []


def test_a_retry_whose_queue_vanished_is_parked_as_orphaned():
    orphan = delivery(
        None,
        exchange="p.deliver",
        routing_key="0.0.0",
        headers={
            "p-target": "p.shop.consumers.gone",
            "p-attempt": 2,
            "p-original-exchange": "p.work",
            "p-original-routing-key": "shop.order.paid",
        },
    )
    action = handler().handle(orphan)
    assert isinstance(action, StorePark)
    req = action.request
    assert req.reason == "orphaned" and req.attempts == 2
    assert req.receiver == "shop.consumers.gone" and req.queue == "p.shop.consumers.gone"
    assert req.routing_key == "shop.order.paid"
    assert "'p.shop.consumers.gone' did not exist" in req.reason_detail


def test_only_redeliveries_count_towards_the_delivery_limit(receiver):
    rec, _calls = receiver
    limits = FakeLimits()
    assert handler(limits).handle(delivery(rec)) == Ack()
    assert limits.checked == [] and limits.forgotten == []
    # Counted, and forgotten only once the ack is sent (the loop does it): a give-back
    # between the receiver's return and the ack still counts.
    assert handler(limits).handle(delivery(rec, redelivered=True)) == Ack(start_key="start-key")
    assert len(limits.checked) == 1 and limits.forgotten == []


def test_over_the_delivery_limit_parks_without_running(receiver):
    rec, calls = receiver
    over = Park(ParkReason.DELIVERY_LIMIT, "the consumer died 5 times while handling it (limit 5)")
    action = handler(FakeLimits(over)).handle(delivery(rec, redelivered=True))
    assert isinstance(action, StorePark) and action.request.reason == "delivery_limit"
    assert action.start_key == "start-key"  # deleted once the row is committed
    assert calls.messages == []


def test_a_failure_after_a_counted_start_keeps_counting_until_the_copy_is_confirmed(receiver):
    rec, calls = receiver
    calls.raise_ = ValueError("x")
    limits = FakeLimits()
    action = handler(limits).handle(delivery(rec, redelivered=True))
    assert isinstance(action, PublishRetry) and limits.forgotten == []
    assert action.start_key == "start-key"  # forgotten once the broker confirmed the copy


def test_a_receiver_calling_sys_exit_is_a_failure_not_our_exit(receiver):
    rec, calls = receiver
    calls.raise_ = SystemExit(3)
    assert isinstance(handler().handle(delivery(rec)), PublishRetry)
