"""``broker.deliveries.DeliveryReader`` reads what pika reads.

On generated input (deliveries with every kind of property and header value, bodies of no,
one and several frames, on a watched channel and on one that is not; returns with content,
acks, cancels and heartbeats between them), cut into arbitrary chunks, the reader produces
the same deliveries and leaves the same frames to pika, in the same order, as pika's own
reading loop (``pika.connection.Connection._on_data_available``, run on the same object),
and counts the same bytes and frames (pika's heartbeat check reads the bytes). Pure: the
"connection" is pika's reading code on a small object that records what it is handed.

The reader on the real broker: ``test_a_consumer_that_only_receives_deliveries_keeps_its_
heartbeat`` below, and every consumer test of the suite (each consumer reads through it).
"""

from __future__ import annotations

import datetime
import itertools
import math
import threading
import time
import uuid
from typing import Any

import pika
import pika.connection
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pika import frame, spec
from pika.channel import ContentFrameAssembler

from django_rmq_retry.broker.connection import connect
from django_rmq_retry.broker.deliveries import DeliveryReader, read_deliveries
from tests.conftest import BROKER_URL

WATCHED, OTHER = 1, 2


class _Channel:
    """What pika's channel does with content frames: assemble, then hand the delivery on."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.assembler = ContentFrameAssembler()

    def _on_deliver(self, method: frame.Method, header: frame.Header, body: bytes) -> None:
        self.events.append(
            (
                "deliver",
                method.channel_number,
                dict(vars(method.method)),
                dict(vars(header.properties)),
                header.body_size,
                body,
            )
        )


class _Connection:
    """pika's reading loop (its own code) on an object that records what it processes."""

    _on_data_available = pika.connection.Connection._on_data_available
    _read_frame = pika.connection.Connection._read_frame
    _trim_frame_buffer = pika.connection.Connection._trim_frame_buffer

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._channels = {n: _Channel(self.events) for n in (WATCHED, OTHER)}
        self._frame_buffer = b""
        self.bytes_received = 0
        self.frames_received = 0

    def _process_frame(self, value: Any) -> None:
        """As ``Connection._process_frame`` and ``Channel._handle_content_frame`` do."""
        self.frames_received += 1
        channel = self._channels.get(getattr(value, "channel_number", 0))
        content = isinstance(value, frame.Header | frame.Body) or (
            isinstance(value, frame.Method) and spec.has_content(value.method.INDEX)
        )
        if channel is None or not content:
            method = getattr(value, "method", None)
            self.events.append(
                ("frame", type(value).__name__, getattr(value, "channel_number", 0), repr(method))
            )
            return
        whole = channel.assembler.process(value)
        if whole is None:
            return
        if isinstance(whole[0].method, spec.Basic.Deliver):
            channel._on_deliver(*whole)
        else:
            self.events.append(("content", whole[0].method.NAME, vars(whole[1].properties)))


_text = st.text(max_size=12)
_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.decimals(places=2, min_value=-(10**6), max_value=10**6)
    | st.datetimes(datetime.datetime(1970, 1, 1), datetime.datetime(2200, 1, 1)).map(
        lambda d: d.replace(microsecond=0)
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_properties = st.builds(
    pika.BasicProperties,
    content_type=st.none() | st.text(max_size=20),
    content_encoding=st.none() | st.sampled_from(["gzip", "utf-8"]),
    headers=st.none() | st.dictionaries(_text, _value, max_size=5),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 9),
    correlation_id=st.none() | st.text(max_size=20),
    message_id=st.none() | st.text(max_size=36),
    timestamp=st.none() | st.integers(0, 2**40),
    type=st.none() | st.text(max_size=10),
    app_id=st.none() | st.text(max_size=10),
)
_body = st.binary(max_size=300) | st.sampled_from([b"", b"x" * 64, b"y" * 65, b"z" * 200])
BODY_MAX = 64  # a small frame size: bodies of several frames are common in the input


def _deliver(channel: int, tag: int, props: Any, body: bytes, names: tuple[str, str]) -> bytes:
    method = spec.Basic.Deliver(
        consumer_tag=f"ctag-{channel}",
        delivery_tag=tag,
        redelivered=tag % 3 == 0,
        exchange=names[0],
        routing_key=names[1],
    )
    return _content(channel, method, props, body)


def _content(channel: int, method: Any, props: Any, body: bytes) -> bytes:
    out = [
        frame.Method(channel, method).marshal(),
        frame.Header(channel, len(body), props).marshal(),
    ]
    for i in range(math.ceil(len(body) / BODY_MAX)):
        out.append(frame.Body(channel, body[i * BODY_MAX : (i + 1) * BODY_MAX]).marshal())
    return b"".join(out)


_event = st.one_of(
    st.tuples(
        st.just("deliver"),
        st.sampled_from([WATCHED, OTHER]),
        _properties,
        _body,
        st.tuples(st.text(max_size=30), st.text(max_size=30)),
    ),
    st.tuples(st.just("return"), st.sampled_from([WATCHED, OTHER]), _properties, _body),
    st.tuples(st.just("ack"), st.sampled_from([WATCHED, OTHER])),
    st.tuples(st.just("cancel"), st.sampled_from([WATCHED, OTHER])),
    st.just(("heartbeat",)),
)


def _stream(events: list[Any]) -> bytes:
    out = []
    for tag, event in enumerate(events, 1):
        if event[0] == "deliver":
            out.append(_deliver(event[1], tag, event[2], event[3], event[4]))
        elif event[0] == "return":
            method = spec.Basic.Return(312, "NO_ROUTE", exchange="x", routing_key="k")
            out.append(_content(event[1], method, event[2], event[3]))
        elif event[0] == "ack":
            out.append(frame.Method(event[1], spec.Basic.Ack(delivery_tag=tag)).marshal())
        elif event[0] == "cancel":
            method = spec.Basic.Cancel(consumer_tag=f"ctag-{event[1]}")
            out.append(frame.Method(event[1], method).marshal())
        else:
            out.append(frame.Heartbeat().marshal())
    return b"".join(out)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=400, deadline=None)
@given(events=st.lists(_event, max_size=12), cuts=st.lists(st.integers(0, 10**6), max_size=12))
@example(events=[("deliver", WATCHED, pika.BasicProperties(), b"", ("", ""))], cuts=[])
@example(
    events=[("deliver", WATCHED, pika.BasicProperties(headers={"a": 1}), b"q" * 129, ("e", "k"))],
    cuts=list(range(1, 200, 3)),  # a few bytes at a time
)
def test_the_reader_reads_what_pika_reads(events, cuts):
    data = _stream(events)
    pika_side = _Connection()
    for chunk in _chunks(data, cuts):
        pika_side._on_data_available(chunk)
    ours = _Connection()
    reader = DeliveryReader(ours)
    reader.watch(WATCHED)
    for chunk in _chunks(data, cuts):
        reader.feed(chunk)
    assert ours.events == pika_side.events
    assert (ours.bytes_received, ours.frames_received) == (len(data), pika_side.frames_received)
    assert not reader._buffer and not reader._partial  # nothing half read at the end


def test_a_bad_frame_end_raises_as_in_pika_and_is_not_consumed():
    data = _deliver(WATCHED, 1, pika.BasicProperties(), b"body", ("e", "k"))
    broken = data[:-1] + b"\x00"  # the body frame's end octet
    ours = _Connection()
    reader = DeliveryReader(ours)
    reader.watch(WATCHED)
    with pytest.raises(pika.exceptions.InvalidFrameError):
        reader.feed(broken)
    with pytest.raises(pika.exceptions.InvalidFrameError):
        _Connection()._on_data_available(broken)
    assert ours.events == []  # the method and header were read, the delivery never handed on


def test_a_body_longer_than_its_header_says_raises_as_in_pika():
    header = frame.Header(WATCHED, 3, pika.BasicProperties()).marshal()
    method = spec.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="e", routing_key="k")
    data = frame.Method(WATCHED, method).marshal() + header + frame.Body(WATCHED, b"four").marshal()
    reader = DeliveryReader(_Connection())
    reader.watch(WATCHED)
    with pytest.raises(pika.exceptions.BodyTooLongError):
        reader.feed(data)
    with pytest.raises(pika.exceptions.BodyTooLongError):
        _Connection()._on_data_available(data)


def test_a_connection_not_as_expected_keeps_pika_s_own_reading():
    class NotPika:
        _impl = object()

    assert read_deliveries(NotPika()) is None


@pytest.mark.broker
def test_a_consumer_that_only_receives_deliveries_keeps_its_heartbeat():
    """RabbitMQ sends no heartbeat while it sends other frames, so pika's check counts the
    bytes read: the reader must count them too, or pika closes a busy consumer's connection
    as dead after two heartbeat intervals. Deliveries for 4 s with a 1 s heartbeat, every
    one received, the connection open throughout."""
    queue = f"t-deliveries-{uuid.uuid4().hex[:8]}"
    setup = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    setup.channel().queue_declare(queue, auto_delete=False)
    stop = threading.Event()
    published: list[int] = []

    def publish() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        ch = conn.channel()
        while not stop.is_set():
            ch.basic_publish("", queue, str(len(published)).encode())
            published.append(1)
            conn.process_data_events(0.002)
        conn.close()

    received: list[bytes] = []
    consumer = connect(BROKER_URL, heartbeat=1)
    try:
        channel = consumer.channel()
        channel.qos(50)

        def on_message(tag: int, _ex: str, _rk: str, _re: bool, _p: Any, body: bytes) -> None:
            received.append(body)
            channel.ack(tag)

        channel.consume(queue, on_message)
        assert consumer._reader is not None  # the reader took over its input
        publisher = threading.Thread(target=publish)
        publisher.start()
        until = time.monotonic() + 4
        while time.monotonic() < until:
            consumer.pump(0.05)
        stop.set()
        publisher.join()
        deadline = time.monotonic() + 10
        while len(received) < len(published) and time.monotonic() < deadline:
            consumer.pump(0.05)
        assert consumer.is_open
        assert consumer.raw._impl.bytes_received > sum(len(b) for b in received)
        assert [int(b) for b in received] == list(range(len(published)))  # each once, in order
    finally:
        consumer.close()
        setup.channel().queue_delete(queue)
        setup.close()
