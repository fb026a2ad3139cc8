"""The pure field-table codec (``core.amqptable``): cut into entries without decoding."""

from __future__ import annotations

import struct

import pytest

from django_rmq_retry.core import amqptable
from tests.faults.rawamqp import Raw, nested, shortstr, table


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
