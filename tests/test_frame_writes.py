"""Queued frames leave joined (``broker.pikaext``): fewer system calls, the same bytes.

The joining rewrites pika's outgoing queue, so what reaches the broker is checked byte for
byte, with bodies far above the joining cap (partial sends of big pieces) among small ones.
"""

from __future__ import annotations

import collections

import pytest
from django.core.management import call_command

from django_rmq_retry.broker.pikaext import JOIN_LIMIT, join
from django_rmq_retry.publishing.publisher import get_publisher
from tests.testapp.events import other


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
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send_many([{"warm": True}])  # connect
    rmq.get_all(rmq.queue("gamma"))
    transport = get_publisher()._connection.raw._impl._transport
    assert transport._produce.__name__ == "produce_joined", "pika's transport changed shape"
    sends = []
    real_send = transport._sigint_safe_send

    def counting_send(sock, data):
        sends.append(len(data))
        return real_send(sock, data)

    transport._sigint_safe_send = counting_send
    sizes = [i % 7 * 1000 + (700_000 if i % 50 == 0 else 0) for i in range(600)]
    bodies = [{"i": i, "pad": "x" * size} for i, size in enumerate(sizes)]
    results = other.send_many(bodies)
    got = rmq.get_all(rmq.queue("gamma"))
    assert [p.message_id for _m, p, _b in got] == [r.message_id for r in results]
    assert [b for _m, _p, b in got] == [
        f'{{"i":{i},"pad":"{"x" * size}"}}'.encode() for i, size in enumerate(sizes)
    ]
    # pika alone: one send per frame, 3 per message (1,800); joined: a few per hundred.
    assert 0 < len(sends) < 600, len(sends)
