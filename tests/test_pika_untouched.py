"""Importing the app changes nothing in pika; our header guard applies to our connections only.

A library never changes a dependency for the rest of the process: a web worker, ``migrate``
or ``shell`` that imports the app (and ``django.setup()`` with it installed) loads no broker
code at all, and a project's own pika code decodes exactly as pika does, before and after
our connections ran in the same process.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pika.data
import pika.spec
import pytest

from django_rmq_retry.broker import connect, headerguard
from django_rmq_retry.core.envelope import UNDECODABLE_HEADERS, RawHeaders, UndecodableHeaders
from tests.conftest import BROKER_URL
from tests.faults.rawamqp import Raw, RawPublisher, table

ROOT = Path(__file__).resolve().parent.parent

#: A double: pika 1.4 reads it as the integer 2, our connections as the float 2.5 (so the
#: two readings are told apart).
DOUBLE = {"v": Raw(b"d", struct.pack(">d", 2.5)), "ok": 1}
#: A timestamp before 1970: our connections mark the table undecodable (pika raises).
BEFORE_1970 = {"born": Raw(b"T", struct.pack(">q", -86400))}

PROBE = """
import json, sys
import django_rmq_retry
from django_rmq_retry import Message, Policy, Reject, Retry, Topic, receiver
import django
django.setup()
loaded = sorted(m for m in sys.modules if m.startswith("django_rmq_retry.broker."))
pika_loaded = "pika" in sys.modules
import pika, pika.data, pika.spec
print(json.dumps({
    "broker_modules": loaded,
    "pika_loaded": pika_loaded,
    "spec_data_untouched": pika.spec.data is pika.data,
}))
"""


def test_importing_the_app_and_setting_django_up_loads_no_broker_code():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"broker_modules": [], "pika_loaded": False, "spec_data_untouched": True}


def _properties(headers: dict) -> bytes:
    return struct.pack(">H", 1 << 13) + table(headers)


def _pikas_own(headers: dict) -> dict:
    """What pika's own decoder makes of ``headers`` (whatever this pika's version)."""
    return pika.data.decode_table(table(headers), 0)[0]


def test_the_guard_decodes_only_inside_our_connections_io():
    headerguard.install()
    outside = pika.spec.BasicProperties()
    outside.decode(_properties(DOUBLE))
    assert not isinstance(outside.headers, RawHeaders)  # pika's own reading
    assert outside.headers == _pikas_own(DOUBLE)
    inside = pika.spec.BasicProperties()
    with headerguard.decoding():
        inside.decode(_properties(DOUBLE))
    assert isinstance(inside.headers, RawHeaders)
    assert inside.headers == {"v": 2.5, "ok": 1} and type(inside.headers["v"]) is float
    with headerguard.decoding():
        inside.decode(_properties(BEFORE_1970))
    assert UNDECODABLE_HEADERS in inside.headers


@pytest.mark.broker
def test_another_pika_connection_decodes_as_pika_after_ours_ran(broker_ok):
    queue = f"t-untouched-{uuid.uuid4().hex[:8]}"
    plain = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        plain_channel = plain.channel()
        plain_channel.queue_declare(queue)
        raw = RawPublisher(BROKER_URL)
        try:
            for _ in range(2):
                assert raw.publish("", queue, b"{}", headers=DOUBLE) == "ack"
        finally:
            raw.close()

        ours = connect(BROKER_URL)  # our connection: the guard is in place from now on
        try:
            channel = ours.channel()
            seen: list[dict] = []

            def on_message(tag, _exchange, _key, _redelivered, properties, _body):
                seen.append(properties["headers"])
                channel.ack(tag)

            channel.qos(1)
            tag = channel.consume(queue, on_message)
            for _ in range(200):
                if seen:
                    break
                ours.pump(0.05)
            channel.cancel(tag)
        finally:
            ours.close()
        assert headerguard.installed()
        assert seen and seen[0] == {"v": 2.5, "ok": 1}  # ours: the double as a float

        # The project's own pika connection, in the same process and thread, after ours:
        method, properties, _body = plain_channel.basic_get(queue, auto_ack=True)
        assert method is not None
        assert not isinstance(properties.headers, (RawHeaders, UndecodableHeaders))
        assert properties.headers == _pikas_own(DOUBLE)
    finally:
        if plain.is_open:
            plain.channel().queue_delete(queue)
            plain.close()
