"""``broker.links``: pika's public event-loop adapters (asyncio and select) behind our
``Link``: failover, errors as ``connection.connect`` words them, close reasons from
callbacks, blocked notices, two links on one loop (the real broker)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pika.frame
import pika.spec
import pytest
from django.conf import settings
from django.test import override_settings

from django_rmq_retry import broker
from django_rmq_retry.broker import headerguard, links
from django_rmq_retry.broker.translate import describe, refusal
from django_rmq_retry.broker.wire import Encoded, encode_properties
from django_rmq_retry.core.errors import AccessRefused, BrokerUnavailable
from tests.conftest import BROKER_URL
from tests.test_broker_edges import close_connections

DEAD = "amqp://guest:guest@127.0.0.1:1/%2F"
WRONG_PASSWORD = BROKER_URL.replace("guest:guest@", "guest:not-the-password@")
NO_VHOST = BROKER_URL.rsplit("/", 1)[0] + "/no-such-vhost"
# Two spellings of the one real broker, so a test can tell which URL a link used.
FIRST, SECOND = f"{BROKER_URL}?connection_attempts=1", f"{BROKER_URL}?connection_attempts=2"
KINDS = ["asyncio", "select"]


class Loop:
    """One event loop of either kind, run by the test's thread until what it waits for
    happened (polled on the loop itself, so the links' I/O runs meanwhile)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "asyncio":
            self.native: Any = asyncio.new_event_loop()
            self.clock: links.Clock = links.AsyncioClock(self.native)
        else:
            self.native = links.new_ioloop()
            self.clock = links.SelectClock(self.native)

    def open(self, **kwargs: Any) -> links.Link | Exception:
        done: list[links.Link | Exception] = []
        connect = links.asyncio_link if self.kind == "asyncio" else links.select_link
        connect(self.native, done.append, **kwargs)
        self.run_until("the link's outcome", lambda: done)
        assert len(done) == 1, done
        return done[0]

    def link(self, **kwargs: Any) -> links.Link:
        link = self.open(**kwargs)
        assert isinstance(link, links.Link), link
        return link

    def run_until(self, what: str, predicate: Callable[[], object], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout

        def check() -> None:
            if predicate() or time.monotonic() > deadline:
                self._stop()
            else:
                self.clock.call_later(0.01, check)

        self.clock.call_later(0, check)
        with headerguard.decoding():  # as every owner of a link's loop runs it
            if self.kind == "asyncio":
                self.native.run_forever()
            else:
                self.native.start()
        assert predicate(), f"gave up waiting for {what}"

    def _stop(self) -> None:
        self.native.stop()  # both kinds: the loop returns once this turn is done

    def close(self, *opened: links.Link) -> None:
        for link in opened:
            link.close()
        self.run_until("the links to close", lambda: all(not link.is_open for link in opened))
        self.native.close()


def _blocking_error(url: str) -> Exception:
    try:
        broker.connect(url).close()
    except Exception as exc:
        return exc
    raise AssertionError(f"{url} connected")


@pytest.mark.broker
@pytest.mark.parametrize("kind", KINDS)
def test_a_link_fails_with_connect_s_error_and_words(broker_ok, kind):
    loop = Loop(kind)
    for url, expected in (
        (WRONG_PASSWORD, AccessRefused),
        (NO_VHOST, AccessRefused),
        (DEAD, BrokerUnavailable),
    ):
        error = loop.open(url=url)
        assert type(error) is expected, (url, error)
        assert str(error) == str(_blocking_error(url))
        assert "not-the-password" not in str(error)
    loop.close()


@pytest.mark.broker
@pytest.mark.parametrize("kind", KINDS)
def test_links_fail_over_in_connect_order_and_stop_at_a_refused_login(broker_ok, kind):
    loop = Loop(kind)
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URLS": [DEAD, FIRST, SECOND]}):
        first = loop.link()
        assert first.url == FIRST
        after_first = loop.link(after=FIRST)  # SECOND comes next
        assert after_first.url == SECOND
        around = loop.link(after=SECOND)  # DEAD, then around to FIRST
        assert around.url == FIRST
    with override_settings(
        RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URLS": [WRONG_PASSWORD, FIRST]}
    ):
        error = loop.open()
        assert isinstance(error, AccessRefused), error  # the next node shares its users
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URLS": [DEAD, DEAD]}):
        error = loop.open()
        assert type(error) is BrokerUnavailable
        assert "127.0.0.1:1/" in str(error)
    loop.close(first, after_first, around)


@pytest.mark.broker
@pytest.mark.parametrize("kind", KINDS)
def test_two_links_on_one_loop_publish_with_confirms_and_consume(broker_ok, kind):
    """One loop carries a consuming link and a publishing one: a message published with
    ``Encoded`` properties through pika's public ``basic_publish`` is confirmed on one and
    delivered on the other with every property as it was sent."""
    loop = Loop(kind)
    consuming = loop.link(name="test-links-consume")
    publishing = loop.link(name="test-links-publish", blocked_connection_timeout=None)
    assert consuming.frame_max == publishing.frame_max == 131072  # negotiated
    state: dict[str, Any] = {"deliveries": [], "confirms": []}

    def consume_open(channel: Any) -> None:
        state["consume"] = channel
        channel.queue_declare("", exclusive=True, callback=declared)

    def declared(frame: Any) -> None:
        queue = frame.method.queue
        state["consume"].basic_consume(queue, on_message)
        state["queue"] = queue

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        state["deliveries"].append((properties, body))
        channel.basic_ack(method.delivery_tag)

    consuming.channel(consume_open, lambda _ch, reason: state.setdefault("closed", reason))
    loop.run_until("the queue", lambda: "queue" in state)

    def publish_open(channel: Any) -> None:
        channel.confirm_delivery(ack_nack_callback=lambda frame: state["confirms"].append(frame))
        properties = {
            "content_type": "application/json",
            "delivery_mode": 2,
            "message_id": "link-1",
            "headers": {"x-rmq-attempt": 3, "origin": "test"},
        }
        state["sent"] = properties
        wire = Encoded(encode_properties(properties), "link-1")
        channel.basic_publish("", state["queue"], b'{"n": 1}', wire, mandatory=True)

    publishing.channel(publish_open, lambda _ch, reason: state.setdefault("closed", reason))
    loop.run_until(
        "the confirm and the delivery", lambda: state["confirms"] and state["deliveries"]
    )
    assert state["confirms"][0].method.NAME == "Basic.Ack"
    properties, body = state["deliveries"][0]
    assert body == b'{"n": 1}'
    sent = state["sent"]
    assert properties.message_id == "link-1" and properties.headers == sent["headers"]
    assert properties.content_type == sent["content_type"] and properties.delivery_mode == 2
    assert "closed" not in state
    loop.close(consuming, publishing)


@pytest.mark.broker
@pytest.mark.parametrize("kind", KINDS)
def test_close_reasons_come_from_the_callbacks(broker_ok, kind):
    """A channel the broker closes (404), a link the broker closes (an operator's
    ``close_connection``: 320) and a link we close each say why, with no private pika."""
    loop = Loop(kind)
    name = f"test-links-{uuid.uuid4().hex[:8]}"
    link = loop.link(name=name)
    closed: list[BaseException] = []
    link.on_closed(closed.append)
    reasons: dict[str, BaseException] = {}

    def opened(channel: Any) -> None:
        channel.queue_declare(f"no-such-queue-{name}", passive=True)

    link.channel(opened, lambda _ch, reason: reasons.setdefault("channel", reason))
    loop.run_until("the channel's close", lambda: "channel" in reasons)
    assert describe(reasons["channel"]).startswith("404 NOT_FOUND - no queue")
    assert refusal(reasons["channel"]) is None  # a missing queue is no refused message
    assert link.is_open and link.close_reason is None and link.closed_why == ""

    assert close_connections(name) == 1
    loop.run_until("the link's close", lambda: closed)
    assert link.closed_why.startswith("320 CONNECTION_FORCED")
    assert closed == [link.close_reason] and not link.is_open

    ours = loop.link(name=name)
    gone: list[BaseException] = []
    ours.on_closed(gone.append)
    ours.close()
    loop.run_until("our link's close", lambda: gone)
    assert "200" in ours.closed_why and "Normal shutdown" in ours.closed_why
    loop.close()


def test_blocked_notices_reach_the_listeners_and_end_with_the_link():
    """pika's blocked and unblocked callbacks (fed the frames RabbitMQ sends during a
    memory alarm) set ``blocked`` and tell each listener; a closed link is not blocked.
    (A real alarm is raised by the fault suites, which own the broker's settings.)"""

    class Raw:
        is_open = True

        def __init__(self) -> None:
            self.blocked: list[Callable[..., None]] = []
            self.unblocked: list[Callable[..., None]] = []
            self.closed: list[Callable[..., None]] = []

        def add_on_connection_blocked_callback(self, callback: Callable[..., None]) -> None:
            self.blocked.append(callback)

        def add_on_connection_unblocked_callback(self, callback: Callable[..., None]) -> None:
            self.unblocked.append(callback)

        def add_on_close_callback(self, callback: Callable[..., None]) -> None:
            self.closed.append(callback)

    raw = Raw()
    link = links.Link(raw, BROKER_URL, links.SelectClock(links.new_ioloop()))
    heard: list[tuple[bool, str]] = []
    link.on_blocked(lambda blocked, why: heard.append((blocked, why)))
    for callback in raw.blocked:
        callback(raw, pika.frame.Method(0, pika.spec.Connection.Blocked(reason="low on memory")))
    assert link.blocked and link.blocked_reason == "low on memory"
    for callback in raw.unblocked:
        callback(raw, pika.frame.Method(0, pika.spec.Connection.Unblocked()))
    assert not link.blocked
    for callback in raw.blocked:
        callback(raw, pika.frame.Method(0, pika.spec.Connection.Blocked(reason="disk")))
    for callback in raw.closed:
        callback(raw, pika.exceptions.ConnectionClosedByBroker(320, "CONNECTION_FORCED"))
    assert heard == [(True, "low on memory"), (False, ""), (True, "disk")]
    assert not link.blocked and link.closed_why == "320 CONNECTION_FORCED"
