"""``broker.joining``: a select link's frames leave joined, the same bytes in the same
order, big bodies among small ones (checked byte for byte at the broker)."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from django_rmq_retry.broker import Outgoing
from django_rmq_retry.broker.joining import JOIN_LIMIT, _JoiningTransport
from django_rmq_retry.publishing.publisher import Publisher


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def get_write_buffer_size(self) -> int:
        return 0


def test_pieces_are_joined_in_order_up_to_the_limit_and_a_big_one_goes_alone():
    pika_side = _Transport()
    joining = _JoiningTransport(pika_side)
    pieces = [b"a" * 10, b"b" * (JOIN_LIMIT - 5), b"c" * 3, b"d" * (3 * JOIN_LIMIT), b"e", b"f" * 7]
    for piece in pieces:
        joining.write(piece)
    assert pika_side.writes == [] and joining.get_write_buffer_size() == sum(map(len, pieces))
    joining.flush()
    assert b"".join(pika_side.writes) == b"".join(pieces)
    assert [w[:1] for w in pika_side.writes] == [b"a", b"b", b"d", b"e"]  # a | b+c | d | e+f
    assert all(len(w) <= JOIN_LIMIT for w in pika_side.writes if w[:1] != b"d")
    assert joining.get_write_buffer_size() == 0
    joining.flush()  # nothing written since: nothing handed over
    assert len(pika_side.writes) == 4


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_a_batch_reaches_the_broker_intact_in_far_fewer_writes(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = f"{rmq.prefix}.joining"
    rmq.ch().queue_declare(queue, auto_delete=True)
    publisher = Publisher(declare=False)
    try:
        publisher.send_items([Outgoing("", queue, b"warm", {"message_id": "warm"})])
        services = publisher._driver._services
        (joining,) = services.transports
        writes: list[int] = []

        class Counting:  # pika's transport, its writes counted
            def __init__(self, transport):
                self.transport = transport

            def write(self, data: bytes) -> None:
                writes.append(len(data))
                self.transport.write(data)

            def __getattr__(self, name):
                return getattr(self.transport, name)

        joining.transport = Counting(joining.transport)
        sizes = [i % 7 * 1000 + (700_000 if i % 50 == 0 else 0) for i in range(600)]
        bodies = [json.dumps({"i": i, "pad": "x" * n}).encode() for i, n in enumerate(sizes)]
        items = [
            Outgoing("", queue, body, {"message_id": f"m{i}", "delivery_mode": 2})
            for i, body in enumerate(bodies)
        ]
        publisher.send_items(items)
        assert all(item.confirmed for item in items)
    finally:
        publisher.close()
    got = rmq.get_all(queue)
    assert [p.message_id for _m, p, _b in got] == ["warm"] + [f"m{i}" for i in range(600)]
    assert [b for _m, _p, b in got][1:] == bodies
    # Frame by frame, pika's transport is handed 3 pieces per message (1,800) at least.
    assert 0 < len(writes) < 600, len(writes)
