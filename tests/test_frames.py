"""``broker.frames.publish_frames`` writes the bytes pika writes for a publish, on generated
input; names AMQP cannot carry are left to pika. Pure, no broker (every broker test
publishes through it: ``ConfirmChannel`` uses it for ``send_many``, retry copies, requeue)."""

from __future__ import annotations

import math

import pika
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pika import frame, spec

from django_rmq_retry.broker.frames import publish_frames


def pika_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    properties: pika.BasicProperties,
    body: bytes,
    body_max: int,
) -> bytes:
    """What ``pika.connection.Connection._send_message`` hands to the socket, rebuilt from
    pika's own frame classes."""
    method = spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
    out = [frame.Method(channel, method).marshal()]
    out.append(frame.Header(channel, len(body), properties).marshal())
    for chunk in range(math.ceil(len(body) / body_max)):
        out.append(frame.Body(channel, body[chunk * body_max : (chunk + 1) * body_max]).marshal())
    return b"".join(out)


_names = st.text(max_size=90) | st.sampled_from(["", "é" * 127, "x" * 255])
_props = st.builds(
    pika.BasicProperties,
    content_type=st.none() | st.text(max_size=20),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    message_id=st.none() | st.text(max_size=40),
    headers=st.none() | st.dictionaries(st.text(max_size=10), st.integers(0, 2**31 - 1)),
)


@settings(max_examples=1500, deadline=None)
@given(
    channel=st.integers(1, 65535),
    exchange=_names,
    routing_key=_names,
    mandatory=st.booleans(),
    properties=_props,
    body=st.binary(max_size=300),
    body_max=st.sampled_from([1, 7, 64, 100, 131064]),
)
@example(1, "ex", "rk", True, pika.BasicProperties(), b"", 131064)  # no body frame at all
@example(1, "ex", "rk", True, pika.BasicProperties(), b"a" * 128, 64)  # exactly two frames
def test_the_frames_are_the_bytes_pika_writes(
    channel, exchange, routing_key, mandatory, properties, body, body_max
):
    encoded = b"".join(properties.encode())
    ours = publish_frames(channel, exchange, routing_key, mandatory, encoded, body, body_max)
    assert ours == pika_frames(
        channel, exchange, routing_key, mandatory, properties, body, body_max
    )


def test_names_amqp_cannot_carry_take_pikas_path():
    props = b"".join(pika.BasicProperties().encode())
    assert publish_frames(1, "x" * 256, "rk", True, props, b"", 100) is None
    assert publish_frames(1, "ex", "é" * 128, True, props, b"", 100) is None  # 256 bytes
    assert publish_frames(1, b"ex", "rk", True, props, b"", 100) is None  # type: ignore[arg-type]
    assert publish_frames(1, "ex", "rk", True, props, bytearray(b"b"), 100) is None  # type: ignore[arg-type]
