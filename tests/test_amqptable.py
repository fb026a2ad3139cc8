"""The pure field-table codec (``core.amqptable``): cut into entries without decoding, and
read as the values each type encodes (the same on every pika version; pika 1.4's own reader
turns floats and doubles into integers)."""

from __future__ import annotations

import math
import struct
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pika.data
import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_rmq_retry.core import amqptable
from tests.faults.rawamqp import Raw, longstr, nested, shortstr, table


def test_entries_are_the_bytes_of_each_key_and_value_in_order():
    values = {
        "d": Raw(b"D", struct.pack(">Bi", 2, 150)),
        "s": Raw(b"s", struct.pack(">h", -2)),
        "deep": nested(40),
        "\u20ac" * 85: Raw(b"V", b""),
    }
    found = amqptable.entries(table(values))
    assert list(found) == list(values)
    for key, value in values.items():
        assert found[key] == shortstr(key) + value.kind + value.data
    assert amqptable.join(list(found.values())) == table(values)


def test_a_key_that_is_not_utf8_is_bytes_as_clients_read_it():
    data = shortstr(b"\xff\xfe") + b"t\x01"
    found = amqptable.entries(struct.pack(">I", len(data)) + data)
    assert found == {b"\xff\xfe": data}


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00",  # shorter than its length
        struct.pack(">I", 9) + shortstr("a") + b"t\x01",  # length says more
        struct.pack(">I", 4) + shortstr("a") + b"Z\x01",  # unknown type
        struct.pack(">I", 7) + shortstr("a") + b"S\x00\x00",  # a length past the end
        struct.pack(">I", 2) + shortstr("a"),  # a key without a value
    ],
)
def test_a_table_that_is_not_well_formed_is_refused(data):
    with pytest.raises(amqptable.BadTable):
        amqptable.entries(data)


# Values ------------------------------------------------------------------------------------
def _f32(value: float) -> float:
    """``value`` as a single-precision float holds it (what an ``f`` entry encodes)."""
    return struct.unpack(">f", struct.pack(">f", value))[0]


#: One entry of each field type a client may write, and the value it encodes.
EACH_TYPE = {
    "t": (Raw(b"t", b"\x01"), True),
    "t0": (Raw(b"t", b"\x00"), False),
    "b": (Raw(b"b", struct.pack(">b", -5)), -5),
    "B": (Raw(b"B", struct.pack(">B", 250)), 250),
    "s": (Raw(b"s", struct.pack(">h", -300)), -300),
    "U": (Raw(b"U", struct.pack(">h", -301)), -301),
    "u": (Raw(b"u", struct.pack(">H", 65000)), 65000),
    "I": (Raw(b"I", struct.pack(">i", -7)), -7),
    "i": (Raw(b"i", struct.pack(">I", 4_000_000_000)), 4_000_000_000),
    "l": (Raw(b"l", struct.pack(">q", -(2**40))), -(2**40)),
    "L": (Raw(b"L", struct.pack(">q", -(2**63))), -(2**63)),
    "f": (Raw(b"f", struct.pack(">f", 2.5)), 2.5),
    "f-third": (Raw(b"f", struct.pack(">f", 1 / 3)), _f32(1 / 3)),
    "d": (Raw(b"d", struct.pack(">d", 0.1)), 0.1),
    "d-huge": (Raw(b"d", struct.pack(">d", 1.7976931348623157e308)), 1.7976931348623157e308),
    "d-inf": (Raw(b"d", struct.pack(">d", -math.inf)), -math.inf),
    "D": (Raw(b"D", struct.pack(">Bi", 2, 150)), Decimal("1.50")),
    "D-255": (Raw(b"D", struct.pack(">Bi", 255, -7)), Decimal("-7E-255")),
    "D-0": (Raw(b"D", struct.pack(">Bi", 0, 42)), Decimal(42)),
    "T": (
        Raw(b"T", struct.pack(">Q", 1_700_000_000)),
        datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc),
    ),
    "T-last": (
        Raw(b"T", struct.pack(">Q", 253402300799)),
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc),
    ),
    "V": (Raw(b"V", b""), None),
    "S": (Raw(b"S", longstr("café")), "café"),
    "S-latin1": (Raw(b"S", longstr("café".encode("latin-1"))), "café".encode("latin-1")),
    "x": (Raw(b"x", longstr(b"\x00\xff")), b"\x00\xff"),
    "A": (
        Raw(b"A", longstr(b"f" + struct.pack(">f", 3.0) + b"D\x01\xff\xff\xff\xf1" + b"V")),
        [3.0, Decimal("-1.5"), None],
    ),
    "F": (
        Raw(b"F", table({"r": Raw(b"d", struct.pack(">d", 0.25)), "at": Raw(b"T", bytes(8))})),
        {"r": 0.25, "at": datetime(1970, 1, 1, tzinfo=timezone.utc)},
    ),
}


def test_each_type_decodes_as_the_value_it_encodes():
    found = amqptable.decode(table({k: raw for k, (raw, _value) in EACH_TYPE.items()}))
    assert list(found) == list(EACH_TYPE)
    for key, (_raw, value) in EACH_TYPE.items():
        assert found[key] == value, key
        assert type(found[key]) is type(value), key
    assert str(found["D"]) == "1.50"  # the sender's exponent, not Decimal("1.5")
    assert found["T"].utcoffset() == timedelta(0)
    assert [type(v) for v in found["A"]] == [float, Decimal, type(None)]


@given(st.binary(min_size=8, max_size=8))
def test_a_double_is_the_float_of_its_exact_bits(bits):
    value = amqptable.decode(table({"d": Raw(b"d", bits)}))["d"]
    assert type(value) is float
    assert struct.pack(">d", value) == bits  # NaN payloads and -0.0 too


@given(st.binary(min_size=4, max_size=4))
def test_a_float_is_the_exact_value_of_its_single(bits):
    value = amqptable.decode(table({"f": Raw(b"f", bits)}))["f"]
    assert type(value) is float
    if math.isnan(value):
        assert math.isnan(struct.unpack(">f", bits)[0])
    else:
        assert struct.pack(">f", value) == bits


@given(st.integers(0, 255), st.integers(-(2**31), 2**31 - 1))
def test_a_decimal_keeps_its_scale(scale, raw):
    value = amqptable.decode(table({"D": Raw(b"D", struct.pack(">Bi", scale, raw))}))["D"]
    assert value.as_tuple().exponent == -scale
    assert value.scaleb(scale) == raw


#: Values pika 1.4 reads as we do (all but ``f`` and ``d``, which it truncates to integers).
PIKA_READS = st.one_of(
    st.sampled_from([Raw(b"t", b"\x00"), Raw(b"t", b"\x02"), Raw(b"V", b"")]),
    st.integers(-(2**7), 2**7 - 1).map(lambda v: Raw(b"b", struct.pack(">b", v))),
    st.integers(0, 2**8 - 1).map(lambda v: Raw(b"B", struct.pack(">B", v))),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: Raw(b"s", struct.pack(">h", v))),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: Raw(b"U", struct.pack(">h", v))),
    st.integers(0, 2**16 - 1).map(lambda v: Raw(b"u", struct.pack(">H", v))),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: Raw(b"I", struct.pack(">i", v))),
    st.integers(0, 2**32 - 1).map(lambda v: Raw(b"i", struct.pack(">I", v))),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: Raw(b"l", struct.pack(">q", v))),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: Raw(b"L", struct.pack(">q", v))),
    st.tuples(st.integers(0, 30), st.integers(-(2**31), 2**31 - 1)).map(
        lambda sv: Raw(b"D", struct.pack(">Bi", *sv))
    ),
    st.integers(0, 253402300799).map(lambda v: Raw(b"T", struct.pack(">Q", v))),
    st.binary(max_size=20).map(lambda b: Raw(b"S", longstr(b))),
    st.binary(max_size=20).map(lambda b: Raw(b"x", longstr(b))),
)
PIKA_VALUES = st.recursive(
    PIKA_READS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(
            lambda vs: Raw(b"A", longstr(b"".join(v.kind + v.data for v in vs)))
        ),
        st.dictionaries(st.text(max_size=5), inner, max_size=3).map(lambda d: Raw(b"F", table(d))),
    ),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=8), PIKA_VALUES, max_size=6))
def test_every_other_type_reads_as_pika_reads_it(values):
    data = table(values)
    ours = amqptable.decode(data)
    theirs, _end = pika.data.decode_table(data, 0)
    assert ours == theirs
    assert _types(ours) == _types(theirs)


def _types(value: object) -> object:
    """The type of each value, nested (pika's ``long`` is an ``int`` of its own: ours is
    a plain ``int``)."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return int if isinstance(value, int) and not isinstance(value, bool) else type(value)


def test_a_key_given_twice_keeps_its_last_value_at_its_last_place():
    data = shortstr("a") + b"b\x01" + shortstr("z") + b"V" + shortstr("a") + b"b\x02"
    raw = struct.pack(">I", len(data)) + data
    assert list(amqptable.decode(raw).items()) == [("z", None), ("a", 2)]
    assert list(amqptable.entries(raw)) == ["z", "a"]


@pytest.mark.parametrize(
    ("values", "path", "what"),
    [
        ({"born": Raw(b"T", struct.pack(">q", -86400))}, ("'born'",), "(signed: -86400)"),
        ({"at": Raw(b"T", struct.pack(">Q", 253402300800))}, ("'at'",), "253402300800 seconds"),
        (
            {"ok": 1, "meta": {"k": [1, Raw(b"T", struct.pack(">Q", 2**63))]}},
            ("'meta'", "'k'", "[1]"),
            "out of the range Python dates can hold",
        ),
        ({"v": Raw(b"Z", b"")}, ("'v'",), "field type b'Z' value cannot be decoded"),
        ({"deep": nested(amqptable.MAX_DEPTH + 1)}, None, "nested too deeply to decode"),
    ],
)
def test_a_value_python_cannot_hold_is_refused_with_where_it_is(values, path, what):
    with pytest.raises(amqptable.BadValue) as refused:
        amqptable.decode(table(values))
    assert what in refused.value.what
    if path is not None:
        assert refused.value.path == path
    else:
        assert refused.value.path[:2] == ("'deep'", "'n'")
        assert len(refused.value.path) == amqptable.MAX_DEPTH + 1


def test_nesting_up_to_the_limit_decodes():
    found = amqptable.decode(table({"deep": nested(amqptable.MAX_DEPTH)}))
    for _ in range(amqptable.MAX_DEPTH):
        found = found["deep" if "deep" in found else "n"]
    assert found == {"n": 1}


def test_an_inner_length_past_the_table_is_a_bad_table_not_a_value():
    inner = shortstr("a") + b"S" + struct.pack(">I", 20) + b"ab"
    with pytest.raises(amqptable.BadTable) as refused:
        amqptable.decode(struct.pack(">I", len(inner)) + inner)
    assert not isinstance(refused.value, amqptable.BadValue)
