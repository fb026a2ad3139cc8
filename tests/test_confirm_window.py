"""``broker.window.ConfirmWindow``: confirms in flight, answers per message, the search for
a message the broker refuses (a state machine on the loop), stalls and outages.

Most tests drive the window over a fake link whose channels speak pika's frames and a
virtual clock; the last one runs it on the real broker through both kinds of link."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions as pex
import pika.frame
import pika.spec
import pytest

from django_rmq_retry.broker import confirms, links
from django_rmq_retry.broker.confirms import Outgoing
from django_rmq_retry.broker.window import ConfirmWindow
from django_rmq_retry.broker.wire import Encoded
from django_rmq_retry.core.errors import ConnectionLost, MessageRefused
from tests.conftest import BROKER_URL
from tests.test_links import Loop

USER_ID_REFUSED = (
    "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'"
)


class FakeClock:
    """Virtual time: timers run only when the test advances it."""

    def __init__(self) -> None:
        self.time = 0.0
        self.timers: list[FakeTimer] = []

    def now(self) -> float:
        return self.time

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.time + delay, callback)
        self.timers.append(timer)
        return timer

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        self.call_later(0, callback)

    def advance(self, seconds: float = 0.0) -> None:
        """Run every timer due by ``now + seconds`` in due order (and those they set)."""
        end = self.time + seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and t.due <= end]
            if not due:
                break
            timer = min(due, key=lambda t: t.due)
            self.timers.remove(timer)
            self.time = max(self.time, timer.due)
            timer.callback()
        self.time = end


class FakeTimer:
    def __init__(self, due: float, callback: Callable[[], None]) -> None:
        self.due = due
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeChannel:
    """pika's asynchronous channel as the window uses it, fed pika's own frames."""

    def __init__(self, link: FakeLink, number: int, on_open: Any, on_close: Any) -> None:
        self.link = link
        self.number = number
        self.on_open = on_open
        self.on_close = on_close
        self.is_open = False
        self.published: list[tuple[str, str, bytes, Any]] = []
        self.on_confirm: Any = None
        self.on_return: Any = None

    # The window's side
    def add_on_return_callback(self, callback: Any) -> None:
        self.on_return = callback

    def confirm_delivery(self, ack_nack_callback: Any, callback: Any = None) -> None:
        self.on_confirm = ack_nack_callback

    def basic_publish(self, exchange, routing_key, body, properties, mandatory=False):
        if not self.is_open:
            raise pex.ChannelWrongStateError("Channel is closed.")
        assert isinstance(properties, pika.BasicProperties) and mandatory
        self.published.append((exchange, routing_key, body, properties))

    def close(self) -> None:
        if self.is_open:
            self.is_open = False
            reason = pex.ChannelClosedByClient(200, "Normal shutdown")
            self.link.clock.call_later(0, lambda: self.on_close(self, reason))

    # The broker's side
    def open(self) -> None:
        self.is_open = True
        self.on_open(self)

    def ack(self, tag: int, multiple: bool = False) -> None:
        self.on_confirm(pika.frame.Method(self.number, pika.spec.Basic.Ack(tag, multiple)))

    def nack(self, tag: int, multiple: bool = False) -> None:
        self.on_confirm(pika.frame.Method(self.number, pika.spec.Basic.Nack(tag, multiple)))

    def give_back(self, index: int) -> None:
        """``basic.return`` of the ``index``-th publish (0-based) on this channel."""
        exchange, key, body, properties = self.published[index]
        method = pika.spec.Basic.Return(312, "NO_ROUTE", exchange, key)
        self.on_return(self, method, pika.BasicProperties(message_id=properties.message_id), body)

    def refuse(self, code: int = 406, text: str = USER_ID_REFUSED) -> None:
        self.is_open = False
        self.on_close(self, pex.ChannelClosedByBroker(code, text))


class FakeLink:
    def __init__(self, clock: FakeClock) -> None:
        self.url = BROKER_URL
        self.clock = clock
        self.blocked = False
        self.is_open = True
        self.frame_max = 131072
        self.channels: list[FakeChannel] = []
        self.listeners: list[Callable[[bool, str], None]] = []

    def channel(self, on_open: Any, on_close: Any) -> FakeChannel:
        channel = FakeChannel(self, len(self.channels) + 1, on_open, on_close)
        self.channels.append(channel)
        self.clock.call_later(0, channel.open)  # pika opens it a round trip later
        return channel

    def on_blocked(self, listener: Callable[[bool, str], None]) -> None:
        self.listeners.append(listener)

    def block(self, blocked: bool) -> None:
        self.blocked = blocked
        for listener in self.listeners:
            listener(blocked, "low on memory" if blocked else "")

    def drop(self, reason: BaseException) -> None:
        """The connection goes: every channel hears the connection's reason."""
        self.is_open = False
        for channel in self.channels:
            if channel.is_open:
                channel.is_open = False
                channel.on_close(channel, reason)

    @property
    def channel_now(self) -> FakeChannel:
        return self.channels[-1]


class Owner:
    """A window's owner: what it heard, in order."""

    def __init__(self, link: FakeLink, **kwargs: Any) -> None:
        self.answers: list[tuple[str, str]] = []
        self.outages: list[tuple[str, list[str]]] = []
        self.window = ConfirmWindow(link, on_outage=self.outage, **kwargs)

    def submit(self, *names: str, **properties: Any) -> list[Outgoing]:
        items = []
        for name in names:
            props = {"message_id": name, "delivery_mode": 2, **properties}
            item = Outgoing("work", "key", name.encode(), props)
            self.window.submit(item, self.answer)
            items.append(item)
        return items

    def answer(self, item: Outgoing) -> None:
        state = "returned" if item.returned else item.state
        self.answers.append((item.message_id, state))

    def outage(self, why: str, items: list[Outgoing]) -> None:
        self.outages.append((why, [item.message_id for item in items]))


def _ids(channel: FakeChannel) -> list[str]:
    return [properties.message_id for *_rest, properties in channel.published]


def _setup() -> tuple[FakeClock, FakeLink]:
    clock = FakeClock()
    return clock, FakeLink(clock)


def test_answers_follow_acks_multiple_acks_and_nacks():
    clock, link = _setup()
    progress: list[int] = []
    owner = Owner(link, on_progress=lambda: progress.append(owner.window.unconfirmed))
    owner.submit("a", "b")  # before the channel is open: they wait
    assert owner.window.state == "opening" and link.channels[0].published == []
    clock.advance()
    owner.submit("c", "d", "e")
    channel = link.channel_now
    assert _ids(channel) == ["a", "b", "c", "d", "e"] and owner.window.unconfirmed == 5
    assert all(isinstance(p, Encoded) for *_r, p in channel.published)
    channel.ack(3, multiple=True)
    channel.nack(4)
    channel.ack(5)
    assert owner.answers == [("a", "ack"), ("b", "ack"), ("c", "ack"), ("d", "nack"), ("e", "ack")]
    assert owner.window.unconfirmed == 0 and not owner.outages
    assert progress == [2, 1, 0]  # once per confirm frame, after its answers


def test_a_return_marks_the_message_with_the_same_id_route_and_body():
    clock, link = _setup()
    owner = Owner(link)
    clock.advance()
    first = Outgoing("work", "key", b"one", {"message_id": "same"})
    second = Outgoing("work", "key", b"two", {"message_id": "same"})
    owner.window.submit(first, owner.answer)
    owner.window.submit(second, owner.answer)
    link.channel_now.give_back(1)
    link.channel_now.ack(2, multiple=True)
    assert first.confirmed and second.returned and not second.confirmed
    assert owner.answers == [("same", "ack"), ("same", "returned")]


def test_a_refused_message_is_found_by_publishing_each_suspect_alone_once_more():
    clock, link = _setup()
    owner = Owner(link)
    clock.advance()
    owner.submit("a", "b", "c", "d", "e")
    first = link.channel_now
    first.ack(1)  # a is stored before the broker reads c
    first.refuse()  # c carries what the broker refuses: b..e get no answer
    assert owner.window.state == "isolating"
    owner.submit("f")  # waits for the search
    clock.advance()
    second = link.channel_now
    assert second is not first and _ids(second) == ["b"]  # alone
    second.ack(1)
    clock.advance()
    assert _ids(second) == ["b", "c"]
    second.refuse()
    clock.advance()
    third = link.channel_now
    assert _ids(third) == ["d"]
    third.ack(1)
    clock.advance()
    assert _ids(third) == ["d", "e"]
    third.ack(2)
    clock.advance()
    assert _ids(third) == ["d", "e", "f"] and owner.window.state == "normal"
    third.ack(3)
    assert [a for a in owner.answers if a[1] != "ack"] == [("c", "refused")]
    assert {name for name, _state in owner.answers} == set("abcdef")
    published: dict[str, int] = {}
    for channel in link.channels:
        for name in _ids(channel):
            published[name] = published.get(name, 0) + 1
    assert published == {"a": 1, "b": 2, "c": 2, "d": 2, "e": 2, "f": 1}  # once more at most
    assert owner.window.unconfirmed == 0 and not owner.outages


def test_the_pause_between_suspects_is_a_timer_on_the_loop():
    clock, link = _setup()
    owner = Owner(link, step_pause=0.5)
    clock.advance()
    owner.submit("a", "b")
    link.channel_now.refuse()
    clock.advance(0.4)
    assert link.channel_now.published == []  # open, waiting for the pause
    clock.advance(0.1)
    assert _ids(link.channel_now) == ["a"]


def test_a_stall_is_an_outage_and_leaves_every_message_unanswered():
    clock, link = _setup()
    owner = Owner(link, stall_timeout=30)
    clock.advance()
    items = owner.submit("a", "b", "c")
    clock.advance(29)
    link.channel_now.ack(1)  # progress: the clock starts over
    clock.advance(29)
    assert not owner.outages
    clock.advance(1.5)
    assert owner.outages == [("no confirm from the broker in 30s", ["b", "c"])]
    assert [item.state for item in items] == ["ack", "", ""]
    assert not link.channel_now.is_open and owner.window.state == "outage"
    assert owner.window.cause is None  # a stall: no close to blame
    with pytest.raises(ConnectionLost):
        owner.submit("d")


def test_the_stall_clock_stops_while_the_broker_blocks_the_link():
    clock, link = _setup()
    owner = Owner(link, stall_timeout=30)
    clock.advance()
    owner.submit("a")
    clock.advance(10)
    link.block(True)  # a memory alarm: no confirm comes until it ends
    clock.advance(300)
    assert not owner.outages
    link.block(False)
    clock.advance(29)
    assert not owner.outages
    link.channel_now.ack(1)
    clock.advance(300)
    assert not owner.outages and owner.answers == [("a", "ack")]
    owner.submit("b")
    clock.advance(31)
    assert owner.outages == [("no confirm from the broker in 30s", ["b"])]


def test_an_owner_that_does_not_wait_out_alarms_hears_of_a_stall_while_blocked():
    clock, link = _setup()
    owner = Owner(link, stall_timeout=30, wait_out_alarms=False)
    clock.advance()
    owner.submit("a")
    link.block(True)  # a memory alarm: no confirm comes, and this owner's caller waits
    clock.advance(29)
    assert not owner.outages
    clock.advance(1.5)
    assert owner.outages == [("no confirm from the broker in 30s", ["a"])]


def test_any_other_close_is_an_outage_in_publish_order():
    clock, link = _setup()
    owner = Owner(link)
    clock.advance()
    owner.submit("a", "b", "c")
    link.channel_now.refuse()  # isolating: a goes alone, b and c wait, d waits too
    owner.submit("d")
    clock.advance()
    dropped = pex.ConnectionClosedByBroker(320, "CONNECTION_FORCED - broker shutdown")
    link.drop(dropped)
    assert owner.outages == [
        ("the publishing channel closed: 320 CONNECTION_FORCED - broker shutdown", list("abcd"))
    ]
    assert owner.window.cause is dropped  # the owner reads what closed it
    assert owner.answers == []


def test_a_connection_level_refusal_searches_on_a_new_link():
    """A properties frame over frame_max makes RabbitMQ close the whole connection (501):
    the window asks its owner for a new link and goes on there."""
    clock, link = _setup()
    links_made: list[FakeLink] = []

    def relink(on_done: Callable[[Any], None]) -> None:
        new = FakeLink(clock)
        links_made.append(new)
        clock.call_later(0, lambda: on_done(new))

    owner = Owner(link, relink=relink)
    clock.advance()
    owner.submit("a", "b")
    frame_error = pex.ConnectionClosedByBroker(501, "FRAME_ERROR - frame_too_large")
    link.drop(frame_error)
    clock.advance()
    assert len(links_made) == 1 and _ids(links_made[0].channel_now) == ["a"]
    links_made[0].drop(frame_error)  # a is the one
    clock.advance()
    assert len(links_made) == 2 and _ids(links_made[1].channel_now) == ["b"]
    links_made[1].channel_now.ack(1)
    clock.advance()  # the search ends on the loop's next turn
    assert owner.answers == [("a", "refused"), ("b", "ack")]
    assert owner.window.link is links_made[1] and owner.window.state == "normal"

    clock, link = _setup()
    alone = Owner(link)  # no way to a new link: an outage
    clock.advance()
    alone.submit("a")
    link.drop(frame_error)
    assert alone.outages and alone.outages[0][1] == ["a"]


def test_a_message_the_broker_would_refuse_is_refused_before_it_is_sent():
    clock, link = _setup()
    owner = Owner(link)
    clock.advance()
    with pytest.raises(MessageRefused, match="not the connection's login"):
        owner.submit("a", user_id="mallory")
    assert link.channel_now.published == [] and owner.window.unconfirmed == 0


def _declare(queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    conn.channel().queue_declare(queue, arguments={"x-expires": 600_000})
    conn.close()


def _drain(queue: str) -> list[str]:
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    channel = conn.channel()
    ids = []
    while True:
        method, properties, _body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        ids.append(properties.message_id)
    channel.queue_delete(queue)
    conn.close()
    return ids


@pytest.mark.broker
@pytest.mark.parametrize("kind", ["select", "asyncio"])
def test_the_real_broker_s_406_is_isolated_on_a_link(broker_ok, monkeypatch, kind):
    """RabbitMQ closes the channel (406) over a ``user_id`` that is not the login (the early
    check off): the culprit is refused, every other message is stored, none more than
    twice, and the link stays open throughout."""
    monkeypatch.setattr(confirms, "early_refusal", lambda *a, **k: "")
    queue = f"test-window-{uuid.uuid4().hex[:8]}"
    _declare(queue)
    loop = Loop(kind)
    link = loop.link(name="test-window")
    answers: dict[str, str] = {}
    outages: list[str] = []
    window = ConfirmWindow(link, on_outage=lambda why, _items: outages.append(why))
    names = [f"m{i}" for i in range(12)]
    for name in names:
        props: dict[str, Any] = {"message_id": name, "delivery_mode": 2}
        if name == "m5":
            props["user_id"] = "mallory"
        item = Outgoing("", queue, json.dumps({"n": name}).encode(), props)
        window.submit(item, lambda it: answers.__setitem__(it.message_id, it.state))
    # The window leaves "isolating" on a timer after the last suspect's answer: wait for it.
    loop.run_until(
        "every answer, then normal again",
        lambda: (len(answers) == len(names) and window.state == "normal") or outages,
    )
    assert not outages and link.is_open and window.state == "normal"
    assert answers == {name: "refused" if name == "m5" else "ack" for name in names}
    stored = _drain(queue)
    assert set(stored) == set(names) - {"m5"}
    assert all(stored.count(name) <= 2 for name in names)
    window.close()
    loop.close(link)


@pytest.mark.broker
@pytest.mark.parametrize("kind", ["select", "asyncio"])
def test_the_real_broker_s_501_is_isolated_on_a_new_link(broker_ok, monkeypatch, kind):
    """Properties larger than a frame (the early check off) make RabbitMQ close the whole
    connection (501 FRAME_ERROR): the window goes on over links its owner opens again, the
    culprit is refused and the others are stored."""
    monkeypatch.setattr(confirms, "early_refusal", lambda *a, **k: "")
    queue = f"test-window-{uuid.uuid4().hex[:8]}"
    _declare(queue)
    loop = Loop(kind)
    first = loop.link(name="test-window-501")
    opened = [first]

    def relink(on_done: Callable[[Any], None]) -> None:
        def done(link: Any) -> None:
            if isinstance(link, links.Link):
                opened.append(link)
            on_done(link)

        connect = links.asyncio_link if kind == "asyncio" else links.select_link
        connect(loop.native, done, name="test-window-501")

    answers: dict[str, str] = {}
    outages: list[str] = []
    window = ConfirmWindow(first, relink=relink, on_outage=lambda why, _items: outages.append(why))
    names = [f"m{i}" for i in range(6)]
    for name in names:
        props: dict[str, Any] = {"message_id": name, "delivery_mode": 2}
        if name == "m2":
            props["headers"] = {"big": "x" * 140_000}  # over the 131072-byte frame_max
        item = Outgoing("", queue, b"{}", props)
        window.submit(item, lambda it: answers.__setitem__(it.message_id, it.state))
    # The window leaves "isolating" on a timer after the last suspect's answer: wait for it.
    loop.run_until(
        "every answer, then normal again",
        lambda: (len(answers) == len(names) and window.state == "normal") or outages,
    )
    assert not outages and window.state == "normal"
    assert answers == {name: "refused" if name == "m2" else "ack" for name in names}
    assert not first.is_open and first.closed_why.startswith("501")
    assert window.link is opened[-1] and window.link.is_open
    stored = _drain(queue)
    assert set(stored) == set(names) - {"m2"}
    assert all(stored.count(name) <= 2 for name in names)
    window.close()
    loop.close(*[link for link in opened if link.is_open])
