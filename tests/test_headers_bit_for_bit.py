"""Headers bit for bit: what a foreign client wrote is what every copy we make carries.

A client library decodes an AMQP table into its own types and loses what they cannot say
(a decimal's exponent, an integer's width and sign, a float's single precision). Header
tables are written here as raw frames (``tests/faults/rawamqp.py``: every field type
RabbitMQ accepts, nested tables and arrays, 255-byte keys), received on our connection,
copied for a retry, parked (the row's JSON columns, through the database) and requeued, on
the real broker; after each step the sender's entries must be the bytes it sent, and a
receiver must read the same values on every attempt.
"""

from __future__ import annotations

import struct
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_rmq_retry.broker import Outgoing, connect, encode_properties
from django_rmq_retry.core import amqptable
from django_rmq_retry.core.envelope import RawHeaders, requeue_properties, retry_properties
from django_rmq_retry.core.failure import Failure
from django_rmq_retry.core.names import Names
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.parking.rows import json_safe_headers, properties_json, row_properties
from django_rmq_retry.publishing.publisher import Publisher
from tests.conftest import BROKER_URL
from tests.faults.rawamqp import Raw, RawPublisher, longstr, shortstr, table

NAMES = Names("rmq_retry_bits")


# Field values as the bytes a foreign client writes ---------------------------------------
def _packed(kind: bytes, fmt: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Raw]:
    return values.map(lambda v: Raw(kind, struct.pack(fmt, v)))


def _sized(kind: bytes, data: st.SearchStrategy[bytes]) -> st.SearchStrategy[Raw]:
    return data.map(lambda b: Raw(kind, struct.pack(">I", len(b)) + b))


_FINITE = {"allow_nan": False, "allow_infinity": False}
SCALARS = st.one_of(
    st.sampled_from([Raw(b"t", b"\x00"), Raw(b"t", b"\x01"), Raw(b"V", b"")]),
    _packed(b"b", ">b", st.integers(-(2**7), 2**7 - 1)),
    _packed(b"B", ">B", st.integers(0, 2**8 - 1)),
    _packed(b"s", ">h", st.integers(-(2**15), 2**15 - 1)),
    _packed(b"u", ">H", st.integers(0, 2**16 - 1)),
    _packed(b"I", ">i", st.integers(-(2**31), 2**31 - 1)),
    _packed(b"i", ">I", st.integers(0, 2**32 - 1)),
    _packed(b"l", ">q", st.integers(-(2**63), 2**63 - 1)),
    _packed(b"f", ">f", st.floats(-1e9, 1e9, width=32, **_FINITE)),
    _packed(b"d", ">d", st.floats(-1e18, 1e18, **_FINITE)),
    st.tuples(st.integers(0, 12), st.integers(-(2**31), 2**31 - 1)).map(
        lambda sv: Raw(b"D", struct.pack(">Bi", *sv))
    ),
    _packed(b"T", ">Q", st.integers(0, 253402300799)),
    _sized(b"S", st.text(max_size=40).map(str.encode)),
    _sized(b"x", st.binary(max_size=40)),
)


def _entries(value: st.SearchStrategy[Raw]) -> st.SearchStrategy[bytes]:
    return st.dictionaries(KEYS, value, max_size=4).map(
        lambda d: b"".join(shortstr(k) + v.kind + v.data for k, v in d.items())
    )


def _nest(inner: st.SearchStrategy[Raw]) -> st.SearchStrategy[Raw]:
    array = st.lists(inner, max_size=4).map(lambda vs: b"".join(v.kind + v.data for v in vs))
    return st.one_of(_sized(b"A", array), _sized(b"F", _entries(inner)))


#: Keys of the sender's own: any text up to AMQP's 255 bytes but the broker's and ours.
KEYS = st.one_of(
    st.text(min_size=1, max_size=30),
    st.just("k" * 255),
    st.text(alphabet="é€", min_size=85, max_size=85),  # 170-255 bytes of UTF-8
).filter(
    lambda k: (
        len(k.encode()) <= 255
        and not k.startswith(("x-", NAMES.header("")))
        and k not in ("CC", "BCC")
    )
)
VALUES = st.recursive(SCALARS, _nest, max_leaves=12)
HEADERS = st.dictionaries(KEYS, VALUES, min_size=1, max_size=8)


# The steps, on the real broker ------------------------------------------------------------
class Bench:
    """One connection that receives, a publisher (a link and its confirm window, as retry
    copies are published) and three queues."""

    def __init__(self) -> None:
        self.queues = [f"t-bits-{uuid.uuid4().hex[:8]}-{n}" for n in range(3)]
        self.consumer = connect(BROKER_URL, name="t-bits consumer")
        self.copies = Publisher(BROKER_URL, declare=False)
        self.channel = self.consumer.channel()
        self.channel.qos(10)
        for queue in self.queues:
            self.channel.raw.queue_declare(queue, auto_delete=False)
        self.got: dict[str, list[dict[str, Any]]] = {q: [] for q in self.queues}
        for queue in self.queues:
            self.channel.consume(queue, self._on_message(queue))

    def _on_message(self, queue: str) -> Any:
        def on_message(tag, _exchange, _key, _redelivered, properties, _body):
            self.got[queue].append(properties)
            self.channel.ack(tag)

        return on_message

    def receive(self, queue: str) -> dict[str, Any]:
        for _ in range(400):
            if self.got[queue]:
                return self.got[queue].pop(0)
            self.consumer.pump(0.02)
        raise AssertionError(f"nothing arrived on {queue}")

    def publish(self, queue: str, properties: dict[str, Any]) -> None:
        item = Outgoing("", queue, b"{}", properties)
        self.copies.send_items([item])  # returns once confirmed (raises otherwise)
        assert item.confirmed

    def close(self) -> None:
        for queue in self.queues:
            self.channel.raw.queue_delete(queue)
        self.consumer.close()
        self.copies.close()


@pytest.fixture(scope="module")
def bench(broker_ok):
    made = Bench()
    try:
        yield made
    finally:
        made.close()


def foreign(headers: RawHeaders | dict[str, Any]) -> dict[Any, bytes]:
    """The sender's entries of a received table, as bytes, by key."""
    assert isinstance(headers, RawHeaders), type(headers)
    assert headers.raw is not None
    return {
        k: v
        for k, v in amqptable.entries(headers.raw).items()
        if not str(k).startswith(NAMES.header(""))
    }


def _park_and_read_back(properties: dict[str, Any]) -> dict[str, Any]:
    """The row a park writes (its JSON columns, through the database) and what a requeue
    reads back from it."""
    row = ParkedMessage.objects.create(
        park_key=uuid.uuid4().hex,
        parked_at=datetime.now(timezone.utc),
        fingerprint="bits",
        receiver="bits",
        queue="bits",
        exchange="",
        routing_key="bits",
        message_id="bits",
        body=b"{}",
        body_size=2,
        properties=properties_json(properties),
        headers=json_safe_headers(properties["headers"]),
        reason="max_attempts",
    )
    stored = ParkedMessage.objects.get(pk=row.pk)
    stored.delete()
    return row_properties(stored)


def _retry(properties: dict[str, Any], target: str) -> dict[str, Any]:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return retry_properties(
        properties,
        names=NAMES,
        attempt=2,
        failure=Failure("ValueError", "no " * 40, at),
        exchange="work",
        routing_key="bits.key",
        target_queue=target,
        due_us=1,
    )


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(headers=HEADERS)
def test_a_foreign_table_survives_retry_park_and_requeue_bit_for_bit(bench, headers):
    sent = table(headers)
    first, second, third = bench.queues
    raw = RawPublisher(BROKER_URL)
    try:
        assert raw.publish("", first, b"{}", headers=headers, message_id="m1") == "ack"
    finally:
        raw.close()

    delivered = bench.receive(first)
    # The broker passes every entry through byte for byte; RabbitMQ 4 may reorder them (it
    # keeps a table as a map), so entries are compared by key, here and below.
    assert amqptable.entries(delivered["headers"].raw) == amqptable.entries(sent)
    wanted = foreign(delivered["headers"])
    values = dict(delivered["headers"])

    bench.publish(second, _retry(delivered, second))  # the retry copy
    copy = bench.receive(second)
    assert foreign(copy["headers"]) == wanted
    assert {k: copy["headers"][k] for k in values} == values  # attempt 2 reads attempt 1's
    assert copy["headers"][NAMES.header("attempt")] == 2

    back = _park_and_read_back(copy)  # parked after its last attempt
    requeued_props = requeue_properties(
        back,
        names=NAMES,
        exchange="",
        routing_key=third,
        target_queue=None,
        parked_id=7,
        requeue_count=1,
    )
    bench.publish(third, requeued_props)
    requeued = bench.receive(third)
    assert foreign(requeued["headers"]) == wanted
    assert {k: requeued["headers"][k] for k in values} == values
    assert requeued["headers"][NAMES.header("requeued")] == 1


def test_an_edited_key_is_written_as_edited():
    sent = table({"d": Raw(b"D", struct.pack(">Bi", 2, 150)), "n": Raw(b"b", b"\x05")})
    headers = RawHeaders({"d": Decimal("1.50"), "n": 5}, raw=sent)
    copy = headers.copy()
    copy["n"] = 6
    encoded = encode_properties({"headers": copy})
    assert struct.pack(">Bi", 2, 150) in encoded  # the decimal kept its exponent
    assert b"\x01nI\x00\x00\x00\x06" in encoded  # the edited value, as we write an int


#: Headers as a Node service writes them with amqplib's typed values: each type a client
#: library of ours could not write (pika picks one width per Python type).
AMQPLIB_HEADERS = {
    "price": {"!": "decimal", "value": {"places": 2, "digits": 150}},
    "tiny": {"!": "int8", "value": -5},
    "small": {"!": "int16", "value": -300},
    "ushort": {"!": "uint16", "value": 65000},
    "ubyte": {"!": "uint8", "value": 200},
    "uint": {"!": "uint32", "value": 4000000000},
    "int": {"!": "int32", "value": 7},
    "ratio": {"!": "float", "value": 0.1},
    "exact": 2.5,
    "whole": 3,
    "when": {"!": "timestamp", "value": 1700000000},
    "flag": True,
    "nothing": None,
    "blob": {"type": "Buffer", "data": [0, 255, 7]},
    "nested": {"deep": {"!": "int16", "value": 1}, "list": [1, "two", {"!": "float", "value": 3}]},
    "k" * 255: "a key of AMQP's full 255 bytes",
}


@pytest.mark.faults  # needs Node.js and amqplib (npm ci in tests/foreign)
@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_a_node_service_s_typed_headers_survive_retry_park_and_requeue(bench):
    from tests.test_adversary_decoding import _amqplib

    first, second, third = bench.queues
    message = {"body_b64": "e30=", "options": {"headers": AMQPLIB_HEADERS, "messageId": "n1"}}
    assert _amqplib(first, [message]) == ["ack"]
    delivered = bench.receive(first)
    wanted = foreign(delivered["headers"])
    assert set(wanted) == set(AMQPLIB_HEADERS)
    assert wanted["price"] == shortstr("price") + b"D\x02\x00\x00\x00\x96"
    values = dict(delivered["headers"])
    assert values["price"] == Decimal("1.50")
    # Read as the values they encode (pika 1.4's own reader makes integers of the floats).
    assert type(values["exact"]) is float and values["exact"] == 2.5
    assert type(values["ratio"]) is float and values["ratio"] == _f32(0.1)
    assert values["nested"]["list"] == [1, "two", 3.0]
    assert type(values["nested"]["list"][2]) is float
    assert values["when"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)

    bench.publish(second, _retry(delivered, second))
    copy = bench.receive(second)
    assert foreign(copy["headers"]) == wanted
    assert str(copy["headers"]["price"]) == "1.50"  # not Decimal("1.5") on attempt 2

    requeued_props = requeue_properties(
        _park_and_read_back(copy),
        names=NAMES,
        exchange="",
        routing_key=third,
        target_queue=None,
        parked_id=8,
        requeue_count=1,
    )
    bench.publish(third, requeued_props)
    requeued = bench.receive(third)
    assert foreign(requeued["headers"]) == wanted
    assert {k: requeued["headers"][k] for k in values} == values


#: One entry of every field type RabbitMQ accepts, as a foreign client writes them.
EVERY_TYPE = {
    "t": Raw(b"t", b"\x01"),
    "b": Raw(b"b", struct.pack(">b", -5)),
    "B": Raw(b"B", struct.pack(">B", 250)),
    "s": Raw(b"s", struct.pack(">h", -300)),
    "u": Raw(b"u", struct.pack(">H", 65000)),
    "I": Raw(b"I", struct.pack(">i", -7)),
    "i": Raw(b"i", struct.pack(">I", 4_000_000_000)),
    "l": Raw(b"l", struct.pack(">q", -(2**40))),
    "f": Raw(b"f", struct.pack(">f", 0.1)),
    "d": Raw(b"d", struct.pack(">d", 2.5)),
    "D": Raw(b"D", struct.pack(">Bi", 2, 150)),
    "T": Raw(b"T", struct.pack(">Q", 1_700_000_000)),
    "V": Raw(b"V", b""),
    "S": Raw(b"S", struct.pack(">I", 3) + b"abc"),
    "x": Raw(b"x", struct.pack(">I", 3) + b"\x00\xff\x07"),
    "F": Raw(b"F", table({"in": Raw(b"b", b"\x01"), "at": Raw(b"T", struct.pack(">Q", 1))})),
    "A": Raw(b"A", struct.pack(">I", 8) + b"b\x01" + b"s\x00\x02" + b"V" + b"t\x00"),
    "k" * 255: Raw(b"u", struct.pack(">H", 1)),
}


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_the_consumer_s_retries_park_and_requeue_keep_every_type(rmq, bench):
    """The whole way: our consumer's retry copies through the delay queues (the broker
    dead-letters them, adding and re-encoding ``x-death``), the park, ``rmq_requeue``."""
    import json

    from django.core.management import call_command

    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("alpha")
    body = json.dumps({"id": "bits", "fail": "always"}).encode()
    raw = RawPublisher(BROKER_URL)
    try:
        assert raw.publish("", queue, body, headers=EVERY_TYPE, content_type="application/json")
    finally:
        raw.close()
    call_command("rmq_consume", "alpha", max_messages=3, max_idle_time=60, verbosity=0)
    row = ParkedMessage.objects.get()
    assert row.attempts == 3  # two retry copies went through the delay path
    sent = amqptable.entries(table(EVERY_TYPE))
    parked = row_properties(row)["headers"]
    assert isinstance(parked, RawHeaders)
    assert {k: parked.entries[k] for k in sent} == sent

    call_command("rmq_requeue", no_progress=True, verbosity=0)
    tag = bench.channel.consume(queue, bench._on_message(bench.queues[0]))
    try:
        requeued = bench.receive(bench.queues[0])
    finally:
        bench.channel.cancel(tag)
    assert {k: foreign(requeued["headers"])[k] for k in sent} == sent


def _f32(value: float) -> float:
    return struct.unpack(">f", struct.pack(">f", value))[0]


#: Each field type as a foreign client writes it, and the value a receiver must read in
#: ``message.headers`` (pika 1.4's own reader makes ``2`` of the float ``2.5``).
AS_SENT: dict[str, tuple[Raw, Any]] = {
    "ratio": (Raw(b"f", struct.pack(">f", 2.5)), 2.5),
    "third": (Raw(b"f", struct.pack(">f", 1 / 3)), _f32(1 / 3)),
    "share": (Raw(b"d", struct.pack(">d", 0.1)), 0.1),
    "huge": (Raw(b"d", struct.pack(">d", 1e300)), 1e300),
    "price": (Raw(b"D", struct.pack(">Bi", 2, 150)), Decimal("1.50")),
    "when": (
        Raw(b"T", struct.pack(">Q", 1_700_000_000)),
        datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc),
    ),
    "list": (
        Raw(
            b"A",
            longstr(
                b"f"
                + struct.pack(">f", 3.0)
                + b"d"
                + struct.pack(">d", -0.5)
                + b"D"
                + struct.pack(">Bi", 1, -15)
            ),
        ),
        [3.0, -0.5, Decimal("-1.5")],
    ),
    "table": (
        Raw(
            b"F",
            table({"r": Raw(b"f", struct.pack(">f", 0.25)), "at": Raw(b"T", struct.pack(">Q", 0))}),
        ),
        {"r": 0.25, "at": datetime(1970, 1, 1, tzinfo=timezone.utc)},
    ),
    "flag": (Raw(b"t", b"\x01"), True),
    "tiny": (Raw(b"b", struct.pack(">b", -5)), -5),
    "ubyte": (Raw(b"B", struct.pack(">B", 250)), 250),
    "short": (Raw(b"s", struct.pack(">h", -300)), -300),
    "ushort": (Raw(b"u", struct.pack(">H", 65000)), 65000),
    "int": (Raw(b"I", struct.pack(">i", -7)), -7),
    "uint": (Raw(b"i", struct.pack(">I", 4_000_000_000)), 4_000_000_000),
    "long": (Raw(b"l", struct.pack(">q", -(2**40))), -(2**40)),
    "text": (Raw(b"S", longstr("café")), "café"),
    "blob": (Raw(b"x", longstr(b"\x00\xff")), b"\x00\xff"),
    "none": (Raw(b"V", b""), None),
}


def _typed(value: Any) -> Any:
    """``value`` with the type of every value in it, nested (``2.5 == 2`` is not enough)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value), str(value))  # str: a decimal's exponent, a datetime's zone


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_a_receiver_reads_each_type_as_sent_on_every_attempt_and_after_a_requeue(
    rmq, registry_snapshot
):
    """A raw client's header of every field type: the receiver reads the value it encodes
    on its first attempt, on the retries (copies through the broker's delay levels), and
    after the park and a requeue; each time the delivery carries the sender's bytes."""
    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings

    from django_rmq_retry import Reject, Topic

    topic = Topic("test.types")
    seen: list[tuple[int, int, dict[str, Any], dict[Any, bytes]]] = []

    @topic.connect
    def types(message, **kwargs):
        raw = message.properties["headers"].raw
        entries = {k: v for k, v in amqptable.entries(raw).items() if k in AS_SENT}
        seen.append((message.attempt, message.requeued, dict(message.headers), entries))
        if message.requeued:
            raise Reject("parked again after the requeue")
        raise ValueError("fails until parked")

    call_command("rmq_consume", setup_only=True, verbosity=0)
    headers = {k: raw for k, (raw, _value) in AS_SENT.items()}
    sent = amqptable.entries(table(headers))
    publisher = RawPublisher(BROKER_URL)
    try:
        exchange = rmq.names.work_exchange
        assert publisher.publish(exchange, "test.types", b"{}", headers=headers) == "ack"
    finally:
        publisher.close()
    # No landing: the copies cross the broker's delay levels (which add ``x-death``).
    conf = {**settings.RMQ_RETRY, "DELAY_LANDING_MS": 0}
    with override_settings(RMQ_RETRY=conf):
        call_command("rmq_consume", "types", max_messages=3, max_idle_time=60, verbosity=0)
        row = ParkedMessage.objects.get()
        assert row.attempts == 3
        parked = row_properties(row)["headers"]
        assert {k: parked.entries[k] for k in sent} == sent
        call_command("rmq_requeue", no_progress=True, verbosity=0)
        call_command("rmq_consume", "types", max_messages=1, max_idle_time=60, verbosity=0)

    assert [(attempt, requeued) for attempt, requeued, _h, _e in seen] == [
        (1, 0),
        (2, 0),
        (3, 0),
        (1, 1),
    ]
    wanted = {k: value for k, (_raw, value) in AS_SENT.items()}
    for _attempt, _requeued, got, entries in seen:
        assert {k: got[k] for k in wanted} == wanted
        assert _typed({k: got[k] for k in wanted}) == _typed(wanted)
        assert entries == sent  # the sender's bytes, every time
    row.refresh_from_db()
    assert (row.status, row.reason, row.park_count) == ("parked", "rejected", 2)
    again = row_properties(row)["headers"]
    assert {k: again.entries[k] for k in sent} == sent


@pytest.mark.django_db(transaction=True)
def test_floats_a_database_would_change_keep_the_parked_bytes():
    """PostgreSQL's JSON keeps no sign on zero and stores ``1e+300`` as the integer it
    equals: such floats are stored marked, so the column read back is the one parked and a
    requeue sends the sender's bytes (on SQLite as on PostgreSQL)."""
    values = {"huge": 1e300, "big": 1e16, "minus-zero": -0.0, "plain": 0.1, "small": 1e-5}
    sent = table({k: Raw(b"d", struct.pack(">d", v)) for k, v in values.items()})
    headers = RawHeaders(values, raw=sent)
    back = _park_and_read_back({"headers": headers, "message_id": "floats"})["headers"]
    assert isinstance(back, RawHeaders)  # the digest matched: the bytes travel
    assert back.entries == amqptable.entries(sent)
    assert {k: struct.pack(">d", back[k]) for k in values} == {
        k: struct.pack(">d", v) for k, v in values.items()
    }
