"""Issue 12, part 3: undecodable anything parks, never loops.

A foreign AMQP client (``tests/faults/rawamqp.py``, written from the spec: pika never builds
these frames) publishes values that some decoder on our side rejects — a header pika cannot
decode, a property that is not UTF-8, a body whose JSON or compression does not decode —
each followed by an ordinary message. One real consumer runs against the real broker.

Every bad message must end as a parked row (reason *undecodable*, attempt 1, a reason that
names what was wrong, its bytes kept), its receiver must never run, the consumer must never
lose its connection, and the message behind each bad one must be handled:
published = handled + parked, nothing else.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import struct
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.parking.rows import row_properties
from tests.conftest import BROKER_URL, read_log, wait_for
from tests.faults.conftest import spawn, stop
from tests.faults.rawamqp import BrokerClosed, Raw, RawPublisher, longstr, nested
from tests.waiting import consuming

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JSON = "application/json"


def timestamp(seconds: int, fmt: str = ">Q") -> Raw:
    """An AMQP ``T`` value exactly as another client writes it (``>q``: a signed long)."""
    return Raw(b"T", struct.pack(fmt, seconds))


@dataclass
class Case:
    name: str
    #: "parked": undecodable, the detail must contain ``reason``; "done": the receiver ran.
    want: str
    reason: str = ""
    body: bytes | None = None  # None: {"id": "bad-<name>"} as JSON
    props: dict[str, Any] = field(default_factory=dict)
    #: A routing key of its own: sent through our ``deliver`` exchange (which matches on
    #: the target header, not the key) so that it still reaches the queue.
    routing_key: bytes | None = None

    def data(self) -> bytes:
        if self.body is not None:
            return self.body
        return json.dumps({"id": f"bad-{self.name}"}).encode()


def header_cases() -> list[Case]:
    return [
        # A Java/Go client writes a date before 1970 as a negative signed long.
        Case("ts-1969", "parked", "'born'", props={"headers": {"born": timestamp(-86400, ">q")}}),
        Case("ts-year-10000", "parked", "'born'", props={"headers": {"born": timestamp(2**38)}}),
        # Milliseconds where seconds belong (a common client mistake): year 55,840.
        Case(
            "ts-millis", "parked", "'sent'", props={"headers": {"sent": timestamp(1_700 * 10**9)}}
        ),
        Case(
            "ts-in-table",
            "parked",
            "'meta' > 'at'",
            props={"headers": {"ok": "yes", "meta": {"k": 1, "at": timestamp(2**63)}}},
        ),
        Case(
            "ts-in-array",
            "parked",
            "'dates' [1]",
            props={"headers": {"dates": [timestamp(0), timestamp(2**64 - 1)]}},
        ),
        Case("deep-5000", "parked", "nested too deeply", props={"headers": {"deep": nested(5000)}}),
        # pika reads a double as an integer: 1.8e308 has 309 digits and cannot be sent again,
        # so retrying it crashed the consumer inside its I/O loop (exit, restart, again). Read
        # as the float it is and retried through a copy that keeps its bytes, it is handled.
        Case(
            "huge-double",
            "done",
            body=json.dumps({"id": "huge-double", "fail": 1}).encode(),
            props={"headers": {"big": Raw(b"d", struct.pack(">d", 1.7976931348623157e308))}},
        ),
        # Odd but decodable: handled, and (failing once) retried through a copy pika re-encodes.
        Case(
            "odd-but-fine",
            "done",
            body=json.dumps({"id": "odd-but-fine", "fail": 1}).encode(),
            props={
                "headers": {
                    "dec": Raw(b"D", struct.pack(">Bi", 255, 7)),
                    "dec2": Decimal("-12.5"),
                    "bin": Raw(b"x", longstr(b"\x00\xff")),
                    "latin": Raw(b"S", longstr("café".encode("latin-1"))),
                    "min": Raw(b"l", struct.pack(">q", -(2**63))),
                    "epoch": timestamp(0),
                    "u32": Raw(b"i", struct.pack(">I", 2**32 - 1)),
                }
            },
        ),
    ]


def property_cases() -> list[Case]:
    names = ["content_type", "content_encoding", "correlation_id", "type", "app_id", "reply_to"]
    names += ["cluster_id", "user_id", "expiration"]  # the broker refuses the last two
    cases = [
        Case(f"prop-{name}", "parked", name, props={name: b"\xff\xfe" + name.encode()})
        for name in names
    ]
    # message_id itself: the row is found by the id inside the bytes.
    cases.append(
        Case("prop-message_id", "parked", "message_id", props={"message_id": b"\xffbad-prop-mid"})
    )
    cases.append(Case("header-key", "parked", "header key", props={"headers": {b"k\xff\xfe": "v"}}))
    cases.append(Case("routing-key", "parked", "routing key", routing_key=b"work.\xff\xfe"))
    # Our marker's header name sent by a publisher: an ordinary header, not an undecodable table.
    forged = {"django-rmq-retry-undecodable-headers": "forged", "undecodable_headers": b"\x00"}
    cases.append(
        Case(
            "forged-marker",
            "done",
            body=json.dumps({"id": "forged-marker"}).encode(),
            props={"headers": forged},
        )
    )
    return cases


def body_cases() -> list[Case]:
    deep = b'{"id": "bad-deep", "v": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return [
        Case(
            "huge-int",
            "parked",
            "integer string conversion",  # (3.10 words the 4300 limit otherwise)
            body=b'{"id": "bad-huge-int", "n": ' + b"9" * 5000 + b"}",
        ),
        Case("nan", "parked", "NaN", body=b'{"id": "bad-nan", "v": NaN}'),
        Case("infinity", "parked", "Infinity", body=b'{"id": "bad-infinity", "v": -Infinity}'),
        Case("overflow-float", "parked", "1e999", body=b'{"id": "bad-overflow-float", "v": 1e999}'),
        Case("bad-utf8", "parked", "not valid utf-8", body=b'{"id": "bad-\xff\xfe"}'),
        Case("deep-json", "parked", "nested too deeply", body=deep),
        Case(
            "gzip-corrupt",
            "parked",
            "gzip",
            body=b"\x1f\x8b\x08\x00garbage",
            props={"content_encoding": "gzip"},
        ),
        Case("encoding-br", "parked", "'br'", props={"content_encoding": "br"}),
        Case(
            "gzip-ok",
            "done",
            body=gzip.compress(json.dumps({"id": "gzip-ok", "fail": 1}).encode()),
            props={"content_encoding": "gzip"},
        ),
        Case(
            "deflate-ok",
            "done",
            body=zlib.compress(json.dumps({"id": "deflate-ok"}).encode()),
            props={"content_encoding": "deflate"},
        ),
        Case(
            "utf8-bom",
            "done",
            body=b"\xef\xbb\xbf" + json.dumps({"id": "utf8-bom"}).encode(),
        ),
    ]


GROUPS = {"headers": header_cases, "properties": property_cases, "bodies": body_cases}


def _publish(raw: RawPublisher, queue: str, case: Case, names: Any) -> RawPublisher:
    """Publish one case; on a refusal by the broker, a fresh publisher (the case is dropped)."""
    props: dict[str, Any] = {"content_type": JSON, "delivery_mode": 2}
    props["message_id"] = f"bad-{case.name}"
    props.update(case.props)
    exchange, key = "", queue.encode()
    if case.routing_key is not None:
        exchange, key = names.deliver_exchange, case.routing_key
        props["headers"] = {**props.get("headers", {}), names.target_header: queue}
    if raw.publish(exchange, key, case.data(), **props) != "ack":  # type: ignore[arg-type]
        raise AssertionError(f"{case.name}: not confirmed")
    return raw


def _row_case(row: ParkedMessage, cases: list[Case]) -> str | None:
    for case in cases:
        if f"bad-{case.name}" in row.message_id or (
            case.name == "prop-message_id" and "bad-prop-mid" in row.message_id
        ):
            return case.name
    return None


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_undecodable_parks_at_once_and_the_message_behind_it_is_handled(rmq, group):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("alpha")
    raw = RawPublisher(BROKER_URL)
    sent: list[Case] = []
    refused: list[str] = []
    behind: list[str] = []
    for case in GROUPS[group]():
        try:
            raw = _publish(raw, queue, case, rmq.names)
        except BrokerClosed as exc:
            refused.append(f"{case.name} ({exc.args[0]})")
            raw = RawPublisher(BROKER_URL)
        else:
            sent.append(case)
        follower = f"behind-{case.name}"
        raw.publish(
            "", queue, json.dumps({"id": follower}).encode(), content_type=JSON, delivery_mode=2
        )
        behind.append(follower)
    raw.close()
    _consume_and_check(rmq, group, sent, behind, refused)


def _consume_and_check(
    rmq: Any, group: str, sent: list[Case], behind: list[str], refused: list[str]
) -> None:
    """Run one consumer until every case settled; check each one and count."""
    want_done = {c.name for c in sent if c.want == "done"} | set(behind)
    want_parked = {c.name for c in sent if c.want == "parked"}
    proc = spawn(rmq, "alpha")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            done = {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}
            parked = {_row_case(r, sent) for r in ParkedMessage.objects.all()}
            if want_done <= done and want_parked <= parked:
                break
            assert proc.poll() is None, "the consumer exited"
            time.sleep(0.5)
        time.sleep(1)  # anything still looping shows up as extra starts
    finally:
        out = stop(proc)

    log = read_log(rmq.log)
    done_ids = [e["id"] for e in log if e["event"] == "done"]
    started_bad = sorted(
        {e["id"] for e in log if e["event"] == "start"}
        & {f"bad-{c.name}" for c in sent if c.want == "parked"}
    )
    rows = {_row_case(r, sent): r for r in ParkedMessage.objects.all()}
    problems = []
    for case in sent:
        row = rows.get(case.name)
        if case.want == "done":
            if case.name not in done_ids:
                problems.append(
                    f"{case.name}: not handled"
                    + (f" (parked: {row.reason}: {row.reason_detail})" if row else "")
                )
            continue
        if row is None:
            problems.append(f"{case.name}: not parked")
            continue
        if row.reason != "undecodable" or row.attempts != 1:
            problems.append(
                f"{case.name}: parked as {row.reason} after {row.attempts}: {row.reason_detail}"
            )
        if case.reason not in row.reason_detail:
            problems.append(
                f"{case.name}: reason {row.reason_detail!r} does not name {case.reason!r}"
            )
        if bytes(row.body) != case.data():
            problems.append(f"{case.name}: body not kept bit for bit")
        problems.extend(_kept(case, row))
    for follower in behind:
        if follower not in done_ids:
            problems.append(f"{follower}: the message behind was not handled")
    if started_bad:
        problems.append(f"receiver ran for undecodable messages: {started_bad}")
    reconnects = out.count("connection to RabbitMQ lost")
    internal = out.count("internal error")
    handled = len(set(done_ids))
    published = len(sent) + len(behind)
    print(
        f"\nCOUNTS decoding/{group}: published={published} handled={handled} "
        f"parked={len(rows)} duplicates={len(done_ids) - handled} reconnects={reconnects} "
        f"internal_errors={internal} refused_by_broker={refused}"
    )
    for name, row in sorted(rows.items(), key=lambda kv: str(kv[0])):
        print(f"  {name}: {row.reason} after {row.attempts}: {row.reason_detail[:150]}")
    assert problems == [], "\n".join(problems) + "\n" + out[-3000:]
    assert published == handled + len(rows), (published, handled, len(rows))
    assert reconnects == 0 and internal == 0, out[-3000:]


def _kept(case: Case, row: ParkedMessage) -> list[str]:
    """The bad value's bytes are in the row: a property as it came, headers as raw bytes."""
    props = row_properties(row)
    problems = []
    for name, value in case.props.items():
        if name == "headers" or not isinstance(value, bytes):
            continue
        if props.get(name) != value:
            problems.append(f"{case.name}: property {name} not kept ({props.get(name)!r})")
    if "headers" in case.props and row.reason_detail.startswith("headers cannot be decoded"):
        stored = props.get("undecodable_headers")
        if not isinstance(stored, bytes) or len(stored) < 5:
            problems.append(f"{case.name}: raw header bytes not kept ({row.properties!r})")
    if case.name == "header-key" and props.get("headers") != {b"k\xff\xfe": "v"}:
        problems.append(f"{case.name}: header key not kept ({row.headers!r})")
    return problems


def test_an_undecodable_row_requeues_as_an_ordinary_message_or_parks_again(rmq):
    """The row of an undecodable header table requeues without it (and is handled); a row
    whose property is not UTF-8 goes out exactly as it came and parks again, in its own row."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("alpha")
    raw = RawPublisher(BROKER_URL)
    for mid, props in (
        ("rq-ts", {"headers": {"born": timestamp(-1, ">q")}}),
        ("rq-ct", {"content_type": b"application/json\xff"}),
    ):
        body = json.dumps({"id": mid}).encode()
        assert raw.publish("", queue, body, **{"content_type": JSON, "message_id": mid, **props})
    raw.close()
    proc = spawn(rmq, "alpha")
    try:
        consuming(rmq, queue, child=proc)  # started: Django, then the broker
        assert wait_for(lambda: ParkedMessage.objects.count() == 2, 30)
        call_command("rmq_requeue", no_progress=True)

        def settled() -> bool:
            rows = {r.message_id: r for r in ParkedMessage.objects.all()}
            done = {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}
            return "rq-ts" in done and rows["rq-ct"].status == "parked"

        assert wait_for(settled, 30), stop(proc)[-3000:]
    finally:
        out = stop(proc)
    every = list(ParkedMessage.objects.order_by("pk"))
    rows = {r.message_id: r for r in every}
    assert sorted(r.message_id for r in every) == ["rq-ct", "rq-ts"]
    assert rows["rq-ts"].status == "requeued"
    assert isinstance(row_properties(rows["rq-ts"])["undecodable_headers"], bytes)
    again = rows["rq-ct"]
    assert (again.status, again.reason, again.park_count) == ("parked", "undecodable", 2)
    assert "content_type" in again.reason_detail
    assert row_properties(again)["content_type"] == b"application/json\xff"
    assert [e["id"] for e in read_log(rmq.log) if e["event"] == "done"] == ["rq-ts"]
    assert out.count("connection to RabbitMQ lost") == 0 and out.count("internal error") == 0


def amqplib_cases() -> list[Case]:
    """Messages as a Node.js service writes them with amqplib (its own option names)."""
    return [
        # A JavaScript timestamp is in milliseconds; the AMQP one is in seconds.
        Case(
            "js-ts-millis",
            "parked",
            "'sent': timestamp 1700000000000",
            props={"headers": {"sent": {"!": "timestamp", "value": 1_700_000_000_000}}},
        ),
        # A double as the float it is (pika would read a 301-digit integer): handled.
        Case(
            "js-huge-double",
            "done",
            body=json.dumps({"id": "js-huge-double", "fail": 1}).encode(),
            props={"headers": {"ratio": {"!": "double", "value": 1e300}}},
        ),
        Case(
            "js-huge-int",
            "parked",
            "integer string conversion",
            body=b'{"n": ' + b"7" * 4500 + b"}",
        ),
        Case(
            "js-gzip",
            "done",
            body=gzip.compress(json.dumps({"id": "js-gzip", "fail": 1}).encode()),
            props={"contentEncoding": "gzip"},
        ),
        Case(
            "js-double",
            "done",
            body=json.dumps({"id": "js-double", "fail": 1}).encode(),
            props={"headers": {"ratio": 2.5, "when": {"!": "timestamp", "value": 1_700_000_000}}},
        ),
    ]


def _amqplib(queue: str, messages: list[dict[str, Any]]) -> list[str]:
    """Publish through ``tests/foreign/publish_amqplib.js``; one "ack"/"error ..." per message."""
    here = Path(__file__).parent / "foreign"
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.fail("node and npm are needed: apt-get install -y nodejs npm", pytrace=False)
    if not (here / "node_modules" / "amqplib").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=here, check=True, timeout=300)
    done = subprocess.run(
        [node, "publish_amqplib.js", BROKER_URL, queue],
        input=json.dumps(messages),
        cwd=here,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.splitlines()


@pytest.mark.faults  # needs Node.js and amqplib (npm ci in tests/foreign), like amqp-tools
def test_a_node_service_publishing_with_amqplib(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("alpha")
    cases = amqplib_cases()
    messages = []
    for case in cases:
        options = {"contentType": JSON, "messageId": f"bad-{case.name}", "persistent": True}
        messages.append(
            {
                "body_b64": base64.b64encode(case.data()).decode(),
                "options": {**options, **case.props},
            }
        )
        follower = json.dumps({"id": f"behind-{case.name}"}).encode()
        messages.append(
            {"body_b64": base64.b64encode(follower).decode(), "options": {"contentType": JSON}}
        )
    results = _amqplib(queue, messages)
    assert results == ["ack"] * len(messages), results
    behind = [f"behind-{case.name}" for case in cases]
    _consume_and_check(rmq, "amqplib", cases, behind, [])
