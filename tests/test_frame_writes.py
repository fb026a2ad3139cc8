"""Queued frames leave joined (``broker.pikaext``): fewer system calls, the same bytes.

The joining rewrites pika's outgoing queue, so what reaches the broker is checked byte for
byte, with bodies far above the joining cap (partial sends of big pieces) among small ones.
"""

from __future__ import annotations

import collections
import json
import time

import pytest
from django.core.management import call_command

from django_rmq_retry import broker
from django_rmq_retry.broker.pikaext import JOIN_LIMIT, join


def test_join_keeps_the_bytes_in_order_in_capped_pieces():
    frames = collections.deque(
        [b"a" * 10, b"b" * (JOIN_LIMIT - 5), b"c" * 3, b"d" * (3 * JOIN_LIMIT), b"e", b"f" * 7]
    )
    before = b"".join(frames)
    join(frames)
    assert b"".join(frames) == before
    assert len(frames) == 4  # a+b | c | d (alone: larger than the cap) | e+f
    assert all(len(piece) <= JOIN_LIMIT for piece in frames if piece[:1] != b"d")


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_a_batch_reaches_the_broker_intact_in_far_fewer_sends(rmq):
    """On a blocking connection (the consumer's and its retry copies'), published through
    a ``ConfirmChannel`` as retry copies are."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("gamma")
    connection = broker.connect()
    try:
        channel = broker.ConfirmChannel(connection)
        transport = connection.raw._impl._transport
        assert transport._produce.__name__ == "produce_joined", "pika's transport changed shape"
        sends = []
        real_send = transport._sigint_safe_send

        def counting_send(sock, data):
            sends.append(len(data))
            return real_send(sock, data)

        transport._sigint_safe_send = counting_send
        sizes = [i % 7 * 1000 + (700_000 if i % 50 == 0 else 0) for i in range(600)]
        bodies = [json.dumps({"i": i, "pad": "x" * size}).encode() for i, size in enumerate(sizes)]
        acked: list[bool] = []
        for i, body in enumerate(bodies):
            props = {"message_id": f"m{i}", "delivery_mode": 2}
            channel.publish("", queue, body, props, lambda ok, _ret: acked.append(ok))
        deadline = time.monotonic() + 60  # generous: not a bound on the broker
        while len(acked) < len(bodies) and time.monotonic() < deadline:
            connection.pump(0.05)
        assert acked == [True] * len(bodies)
    finally:
        connection.close()
    got = rmq.get_all(queue)
    assert [p.message_id for _m, p, _b in got] == [f"m{i}" for i in range(600)]
    assert [b for _m, _p, b in got] == bodies
    # pika alone: one send per frame, 3 per message (1,800); joined: a few per hundred.
    assert 0 < len(sends) < 600, len(sends)
