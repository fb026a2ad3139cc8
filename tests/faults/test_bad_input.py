"""Scenario 7: bad input from AMQP clients that are not us.

Messages are published by Debian's ``amqp-publish`` (amqp-tools) and by ``rawamqp`` (a
spec-level publisher in this folder, so typed and absurd header values reach the wire exactly
as written — pika, our own encoder, is never used to build them). Every case must end handled
or parked with a readable reason while one consumer keeps running: no crash, no loop.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import time
from decimal import Decimal

import pytest
from django.core.management import call_command

from django_rmq_retry.models import ParkedMessage
from tests.conftest import BROKER_URL, read_log
from tests.faults.conftest import record, spawn, stop
from tests.faults.rawamqp import BrokerClosed, Raw, RawPublisher, Void, longstr, nested

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

BIG = 16 * 1024 * 1024
JSON = "application/json"


def big_body(case_id: str, **extra) -> bytes:
    """A valid JSON object of exactly 16 MiB."""
    small = json.dumps({"id": case_id, **extra, "pad": ""}).encode()
    return json.dumps({"id": case_id, **extra, "pad": "x" * (BIG - len(small))}).encode()


def amqp_publish(exchange: str, routing_key: str, body: bytes, case: str, *args: str) -> None:
    cmd = [
        "amqp-publish",
        "--url",
        BROKER_URL.replace("%2F", "%2f"),
        "-e",
        exchange,
        "-r",
        routing_key,
        "-p",
        "-H",
        f"case: {case}",
        *args,
    ]
    # Without -b the body is read from stdin, which carries any bytes (invalid UTF-8, 16 MB).
    subprocess.run(cmd, input=body, check=True, timeout=60, capture_output=True)


def test_bad_input_is_handled_or_parked_and_the_consumer_keeps_going(rmq):
    if not shutil.which("amqp-publish"):
        pytest.fail("amqp-publish is missing: apt-get install -y amqp-tools", pytrace=False)
    call_command("rmq_consume", setup_only=True, verbosity=0)
    alpha_q = rmq.queue("alpha")
    attempt = rmq.names.header("attempt")
    proc = spawn(rmq, "alpha", "beta")
    # case -> expected: ("done", id) | ("done-bytes",) | ("parked", reason, attempts or None)
    expected: dict[str, tuple] = {}
    refused: dict[str, str] = {}
    try:
        # --- through amqp-publish (strings only in headers) --------------------------------
        sent = [
            ("bad-json", b'{"id": "bad-json", oops', ["-C", JSON], ("parked", "undecodable", 1)),
            ("bad-utf8", b'{"id": "\xff\xfe"}', ["-C", JSON], ("parked", "undecodable", 1)),
            (
                "bad-utf8-text",
                b"caf\xe9",
                ["-C", "text/plain; charset=utf-8"],
                ("parked", "undecodable", 1),
            ),
            ("empty-json", b"", ["-C", JSON], ("parked", "undecodable", 1)),
            ("empty-no-type", b"", [], ("done-bytes",)),
            ("no-type", b'{"id": "no-type"}', [], ("done-bytes",)),
            ("no-message-id", b'{"id": "no-message-id"}', ["-C", JSON], ("done", "no-message-id")),
            (
                "attempt-string",
                b'{"id": "attempt-string", "fail": "always"}',
                ["-C", JSON, "-H", f"{attempt}: 2"],
                ("parked", "exhausted", 3),
            ),
            (
                "attempt-junk",
                b'{"id": "attempt-junk"}',
                ["-C", JSON, "-H", f"{attempt}: abc"],
                ("done", "attempt-junk"),
            ),
            ("big", big_body("big"), ["-C", JSON], ("done", "big")),
            (
                "encoding-base64",
                b'{"id": "encoding-base64"}',
                ["-C", JSON, "-E", "base64"],
                ("parked", "undecodable", 1),
            ),
        ]
        for case, body, args, want in sent:
            amqp_publish("", alpha_q, body, case, *args)
            expected[case] = want
        amqp_publish(
            rmq.names.work_exchange,
            "test.work",
            b'{"id": "via-topic", "fail": 1}',
            "via-topic",
            "-C",
            JSON,
        )
        expected["via-topic"] = ("done", "via-topic")  # alpha and beta both

        # --- through the raw spec-level client (typed and absurd headers) ------------------
        raw = RawPublisher(BROKER_URL)
        ts = Raw(b"T", struct.pack(">Q", 1_700_000_000))
        raw_cases = [
            (
                "attempt-negative",
                {"id": "attempt-negative", "fail": 1},
                {attempt: -5},
                ("done", "attempt-negative"),
            ),
            (
                "attempt-huge",
                {"id": "attempt-huge", "fail": "always"},
                {attempt: 2**62},
                ("parked", "exhausted", None),
            ),
            (
                "attempt-list",
                {"id": "attempt-list"},
                {attempt: [1, 2, 3]},
                ("done", "attempt-list"),
            ),
            (
                "attempt-table",
                {"id": "attempt-table", "fail": 1},
                {attempt: {"n": 2}},
                ("done", "attempt-table"),
            ),
            (
                "forged-x-death",
                {"id": "forged-x-death", "fail": 2},
                {
                    "x-death": [
                        {
                            "count": 999,
                            "queue": "elsewhere",
                            "reason": "expired",
                            "exchange": "",
                            "routing-keys": ["nowhere"],
                            "time": ts,
                        }
                    ],
                    "x-first-death-queue": "elsewhere",
                    "x-delivery-count": 50,
                },
                ("done", "forged-x-death"),
            ),
            (
                "odd-types",
                {"id": "odd-types", "fail": "always"},
                {
                    "dec": Decimal("1.25"),
                    "void": Void(),
                    "ts": ts,
                    "bytes": Raw(b"x", longstr(b"\x00\xff")),
                    "f32": Raw(b"f", struct.pack(">f", 1.5)),
                    "i8": Raw(b"b", b"\xff"),
                },
                ("parked", "exhausted", 3),
            ),
            ("deep-50", {"id": "deep-50", "fail": 1}, {"deep": nested(50)}, ("done", "deep-50")),
            (
                "deep-300",
                {"id": "deep-300", "fail": "always"},
                {"deep": nested(300)},
                ("parked", None, None),
            ),
            (
                "deep-5000",
                {"id": "deep-5000"},
                {"deep": nested(5000)},
                ("parked", "undecodable", None),
            ),
            (
                "unknown-type",
                {"id": "unknown-type"},
                {"weird": Raw(b"Z", b"")},
                ("parked", "undecodable", None),
            ),
            ("big-fail", None, {}, ("parked", "exhausted", 3)),
            # PostgreSQL refuses NUL in text and NaN in JSON: parked anyway, exactly.
            (
                "nul-text",
                {"id": "nul-text", "reject": True},
                {"a": "b\x00c"},
                ("parked", "rejected", 1),
            ),
            (
                "nul-key",
                {"id": "nul-key", "reject": True},
                {"n\x00ul": 1},
                ("parked", "rejected", 1),
            ),
            (
                "nan-double",
                {"id": "nan-double", "reject": True},
                {"nan": Raw(b"d", struct.pack(">d", float("nan")))},
                ("parked", "rejected", 1),
            ),
        ]
        for case, body, headers, want in raw_cases:
            data = (
                big_body("big-fail", fail="always") if body is None else json.dumps(body).encode()
            )
            props = {"content_type": JSON, "delivery_mode": 2, "headers": {"case": case, **headers}}
            props["message_id"] = f"bad-{case}"
            try:
                assert raw.publish("", alpha_q, data, **props) == "ack", case
            except BrokerClosed as exc:
                # RabbitMQ itself refused the frame: it never reaches a consumer.
                refused[case] = str(exc.args)
                raw = RawPublisher(BROKER_URL)
                continue
            expected[case] = want
        raw.close()

        def outcome():
            done = [e for e in read_log(rmq.log) if e["event"] == "done"]
            parked = {
                (r.headers or {}).get("case") or r.message_id.removeprefix("bad-"): r
                for r in ParkedMessage.objects.all()
            }
            return done, parked

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done, parked = outcome()
            ids = {(e["receiver"], e["id"]) for e in done}
            missing = [
                c
                for c, w in expected.items()
                if (w[0] == "parked" and c not in parked)
                or (w[0] == "done" and ("alpha", w[1]) not in ids)
            ]
            if not missing and sum(1 for e in done if e["id"] is None) >= 2:
                break
            assert proc.poll() is None, f"consumer died: {stop(proc)[-3000:]}"
            time.sleep(0.5)
        time.sleep(1)  # a window, not a wait: anything still looping shows up as extra starts
        assert proc.poll() is None, "the consumer exited"
    finally:
        out = stop(proc)
    done, parked = outcome()
    ids = [(e["receiver"], e["id"]) for e in done]
    problems = []
    for case, want in expected.items():
        if want[0] == "done" and ("alpha", want[1]) not in ids:
            problems.append(
                f"{case}: not handled ({'parked: ' + parked[case].reason_detail if case in parked else 'nothing'})"
            )
        if want[0] == "parked":
            row = parked.get(case)
            if row is None:
                problems.append(f"{case}: not parked")
                continue
            if want[1] and row.reason != want[1]:
                problems.append(
                    f"{case}: parked as {row.reason} ({row.reason_detail}), want {want[1]}"
                )
            if want[2] and row.attempts != want[2]:
                problems.append(f"{case}: parked after {row.attempts} attempts, want {want[2]}")
            if not (row.reason_detail or row.error_message):
                problems.append(f"{case}: parked without a readable reason")
    if ("beta", "via-topic") not in ids:
        problems.append("via-topic: beta did not handle it")
    bytes_done = sum(1 for e in done if e["id"] is None)
    if bytes_done < 2:
        problems.append(f"only {bytes_done} of the 2 non-JSON bodies were handled")
    reconnects = out.count("connection to RabbitMQ lost")
    internal = out.count("internal error")
    loops = out.count("Traceback")
    handled = sum(1 for w in expected.values() if w[0] != "parked") + 1
    record(
        "7 bad input (amqp-publish + raw)",
        published=len(expected),
        handled=len({i for i in ids if i[1] is not None}) + bytes_done,
        parked=len([c for c in expected if c in parked]),
        duplicates=len([i for i in ids if i[1] is not None])
        - len({i for i in ids if i[1] is not None}),
        lost=sum(1 for p in problems if "nothing" in p or "not parked" in p),
        notes=f"refused by the broker: {sorted(refused)}; {reconnects} reconnects, {internal} internal errors, expected handled {handled}",
    )
    for case, row in sorted(parked.items(), key=lambda kv: str(kv[0])):
        print(
            f"  {case}: {row.reason} after {row.attempts}: {(row.reason_detail or row.error_message)[:100]}"
        )
    assert problems == [], "\n".join(problems) + "\n" + out[-4000:]
    assert reconnects == 0, out[-4000:]
    assert internal == 0, out[-4000:]
    assert loops == 0, out[-4000:]
