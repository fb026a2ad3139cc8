"""``broker.wire.encode_properties`` writes the bytes pika writes, on generated input, and
raises where pika raises; pure, no broker."""

from __future__ import annotations

import datetime
import decimal

import pika
import pika.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_rmq_retry.broker.connection import to_pika
from django_rmq_retry.broker.wire import Encoded, decode_properties, encode_properties

_short_text = st.text(max_size=40) | st.binary(max_size=40)
_EDGES = [0, 255, 256, 2**30, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63]
_ints = st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([*_EDGES, -(2**63)])
_leaves = (
    st.text(max_size=30)
    | st.binary(max_size=30)
    | _ints
    | st.booleans()
    | st.none()
    | st.decimals(places=2, min_value=-(10**6), max_value=10**6)
    | st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2100, 1, 1))
    # no floats: pika refuses them, ours writes doubles (test_floats_go_out_as_doubles)
)
_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_short_text, inner, max_size=4),
    max_leaves=12,
)
_properties = st.fixed_dictionaries(
    {},
    optional={
        "content_type": _short_text,
        "content_encoding": _short_text,
        "headers": st.dictionaries(_short_text | st.text(min_size=250, max_size=260), _values),
        "delivery_mode": st.integers(min_value=-1, max_value=300) | st.sampled_from(_EDGES),
        "priority": st.integers(min_value=0, max_value=9),
        "correlation_id": _short_text | st.text(min_size=250, max_size=300),
        "reply_to": _short_text,
        "expiration": st.integers(min_value=0, max_value=10**6).map(str),
        "message_id": _short_text | st.integers(),
        "timestamp": st.integers(min_value=-1, max_value=2**64) | st.sampled_from([2**64 - 1]),
        "type": _short_text,
        "user_id": _short_text,
        "app_id": _short_text,
        "cluster_id": _short_text,
    },
)


def _pika(properties):
    return b"".join(to_pika(properties).encode())


def _outcome(encode, properties):
    try:
        return "ok", encode(properties)
    except Exception as exc:  # the type is what is compared
        return "raised", type(exc)


@settings(max_examples=1500, deadline=None)
@given(_properties)
def test_the_bytes_and_the_errors_are_pika_s(properties):
    assert _outcome(encode_properties, properties) == _outcome(_pika, properties)


def test_a_requeued_message_s_properties_take_the_fast_path_and_decode_back():
    """The usual shapes (ours) are encoded without pika, and pika reads them back."""
    import django_rmq_retry.broker.wire as wire

    properties = {
        "content_type": "application/json",
        "delivery_mode": 2,
        "message_id": "5f0c",
        "timestamp": 1_795_603_072,
        "headers": {"app": "bench", "x-rmq-requeued": 1, "x-rmq-parked-id": "42", "t": None},
    }
    data = wire._encode(properties)  # raises on anything it would leave to pika
    assert data == _pika(properties)
    back = decode_properties(data)
    assert back["headers"] == properties["headers"]
    assert back["message_id"] == "5f0c" and back["delivery_mode"] == 2
    encoded = Encoded(data, "5f0c")
    assert encoded.encode() is not encoded.encode()  # pika inserts into the list it gets
    assert encoded.INDEX == pika.BasicProperties.INDEX


def test_unusual_values_are_left_to_pika():
    import django_rmq_retry.broker.wire as wire

    class Text(str):
        pass

    for odd in (2**64, Text("x"), decimal.Decimal("NaN")):
        with pytest.raises(wire._Unusual):
            wire._encode({"headers": {"v": odd}})
    for usual in (decimal.Decimal("1.5"), datetime.datetime(2026, 1, 1)):
        wire._encode({"headers": {"v": usual}})  # ours, the bytes pika writes (above)
    assert encode_properties({"headers": {"d": decimal.Decimal("1.5")}}) == _pika(
        {"headers": {"d": decimal.Decimal("1.5")}}
    )


_FLOATS = [2.5, -0.0, 1e300, -1e-300, float("inf"), float("-inf"), 5e-324]


@pytest.mark.parametrize("value", _FLOATS)
def test_floats_go_out_as_doubles(value):
    """pika 1.4 refuses a float; a receiver reads a foreign double as one (core.amqptable)
    and may send the headers on, so ours writes it as AMQP's double, wherever it sits: read
    back, the same float, beside values pika would encode (a decimal, a datetime)."""
    from django_rmq_retry.core import amqptable

    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    headers = {
        "ratio": value,
        "nested": {"list": [value, 1], "amount": decimal.Decimal("1.25")},
        "when": when,
    }
    data = encode_properties({"headers": headers})
    table = data[2:]  # after the flag word: the headers are the only property set
    decoded = amqptable.decode(table)
    assert decoded["ratio"] == value and str(decoded["ratio"]) == str(value)  # -0.0 kept
    assert decoded["nested"] == {"list": [value, 1], "amount": decimal.Decimal("1.25")}
    assert decoded["when"] == when


def test_encoded_properties_are_pika_s_and_marshal_to_pika_s_bytes():
    """``Encoded`` is a ``pika.BasicProperties``: the content header pika marshals from it is
    the one pika marshals from its own properties, and its values read back from the bytes."""
    properties = {
        "content_type": "application/json",
        "delivery_mode": 2,
        "message_id": "m-1",
        "user_id": "guest",
        "headers": {"x-rmq-attempt": 2, "note": "é"},
    }
    encoded = Encoded(encode_properties(properties), "m-1")
    assert isinstance(encoded, pika.BasicProperties)
    body = b"x" * 10
    ours = pika.frame.Header(3, len(body), encoded).marshal()
    assert ours == pika.frame.Header(3, len(body), to_pika(properties)).marshal()
    assert encoded.headers == properties["headers"] and encoded.user_id == "guest"
    assert encoded.message_id == "m-1" and encoded.priority is None
    assert encoded.decode()["content_type"] == "application/json"
    assert encoded == Encoded(encoded.data, "m-1") and encoded != Encoded(b"\x00\x00", "m-1")
    with pytest.raises(AttributeError):
        encoded.headers = {}  # the bytes are what is sent: they do not change
    with pytest.raises(TypeError):
        encoded.decode(encoded.data)
    with pytest.raises(AttributeError):
        encoded.nothing_such  # noqa: B018
