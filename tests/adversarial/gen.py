"""The adversary: random messages as a foreign AMQP client would publish them. Seeded, bounded.

One :class:`random.Random` drives everything, so a seed replays a run exactly (``ADV_SEED``).
Header values are encoded here, field type by field type (rawamqp's ``Raw``), so every AMQP
type reaches the wire with the exact bytes we chose — including values no library would send:
timestamps before 1970 (a Java client's negative ``long``) or past year 9999, NaN doubles,
invalid UTF-8 in long strings and keys, decimals with scale 255, unknown type letters, tables
nested hundreds of levels deep. Our own reserved headers are forged with random values too.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from django_rmq_retry.core.names import Names
from tests.faults.rawamqp import Raw, longstr, nested

JSON = "application/json"

#: Every header of ours a foreign publisher might forge (see core/envelope.py).
RESERVED = (
    "attempt",
    "first-failure",
    "last-failure",
    "parked-id",
    "original-routing-key",
    "original-exchange",
    "original-expiration",
    "original-user-id",
    "requeued",
    "target",
    "error",
    "error-type",
    "due",
    "due-us",
)


@dataclass
class Case:
    """One message to publish, and where."""

    n: int
    token: str
    target: str  # "a" | "g" (a receiver queue) | "work" | "other" (a topic exchange)
    client: str  # "raw" | "pika" | "cli"
    body: bytes
    props: dict[str, Any]  # rawamqp properties; headers as {key: Raw}
    pika_headers: dict[str, Any] | None = None  # the same idea as Python values (pika client)
    kind: list[str] = field(default_factory=list)  # what is adversarial, for failure reports

    @property
    def receivers(self) -> tuple[str, ...]:
        return {"a": ("adv_a",), "g": ("adv_g",), "work": ("adv_a", "adv_b"), "other": ("adv_g",)}[
            self.target
        ]

    def describe(self) -> str:
        props = {k: v for k, v in self.props.items() if k != "headers"}
        heads = sorted(str(k)[:40] for k in (self.props.get("headers") or {}))
        return (
            f"#{self.n} {self.token} via {self.client} to {self.target}: {', '.join(self.kind)}; "
            f"body {self.body[:80]!r} ({len(self.body)} bytes); props {str(props)[:300]}; "
            f"header keys {heads[:12]}"
        )


# Field values -------------------------------------------------------------------------------
def _edge_int(rng: random.Random, bits: int, signed: bool) -> int:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return rng.choice([lo, hi, 0, 1, -1 if signed else 2, rng.randint(lo, hi)])


def _text(rng: random.Random, size: int | None = None) -> bytes:
    size = rng.choice([0, 1, 8, 40, 255, 3000]) if size is None else size
    kind = rng.random()
    if kind < 0.5:
        return "".join(rng.choice("abcxyz-_./:é€𝄞 ") for _ in range(size)).encode()[:size] or b""
    if kind < 0.7:  # invalid UTF-8
        return bytes(rng.choice([0xFF, 0xFE, 0xC3, 0x80, 0xED, 0xA0]) for _ in range(max(size, 1)))
    if kind < 0.8:
        return b"a\x00b" * max(size // 3, 1)
    return bytes(rng.randrange(256) for _ in range(size))


TIMESTAMPS = (
    0,
    1,
    1_700_000_000,
    2**63,  # -2**63 as a Java long: before 1970
    2**64 - 1,  # -1: one second before 1970
    2**64 - 86_400 * 365 * 50,  # 1920 as a signed long
    253_402_300_800,  # year 10000
    10**15,  # far future (milliseconds mistaken for seconds, times 1000)
    1_700_000_000_000,  # milliseconds where seconds belong
)


def field_value(rng: random.Random, depth: int) -> Raw:
    """One random header value of a random AMQP field type."""
    kinds = "tbBsuIilfdDSSTxV" + ("AF" if depth < 4 else "")
    k = rng.choice(kinds)
    if k == "t":
        return Raw(b"t", bytes([rng.choice([0, 1, 2, 255])]))
    if k in "bB":
        return Raw(k.encode(), struct.pack(">" + k, _edge_int(rng, 8, k == "b")))
    if k == "s":  # RabbitMQ's signed 16-bit
        return Raw(b"s", struct.pack(">h", _edge_int(rng, 16, True)))
    if k == "u":
        return Raw(b"u", struct.pack(">H", _edge_int(rng, 16, False)))
    if k == "I":
        return Raw(b"I", struct.pack(">i", _edge_int(rng, 32, True)))
    if k == "i":
        return Raw(b"i", struct.pack(">I", _edge_int(rng, 32, False)))
    if k == "l":
        return Raw(b"l", struct.pack(">q", _edge_int(rng, 64, True)))
    if k == "f":
        v = rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 3.4e38, 1e-45, 1.5])
        return Raw(b"f", struct.pack(">f", v))
    if k == "d":
        v = rng.choice([math.nan, math.inf, -math.inf, -0.0, 1.7976931348623157e308, 5e-324, 0.1])
        return Raw(b"d", struct.pack(">d", v))
    if k == "D":
        scale = rng.choice([0, 2, 28, 255])
        return Raw(b"D", struct.pack(">Bi", scale, _edge_int(rng, 32, True)))
    if k == "S":
        return Raw(b"S", longstr(_text(rng)))
    if k == "T":
        return Raw(b"T", struct.pack(">Q", rng.choice(TIMESTAMPS)))
    if k == "x":
        return Raw(b"x", longstr(bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 300])))))
    if k == "V":
        return Raw(b"V", b"")
    if k == "A":
        items = b"".join(_encoded(field_value(rng, depth + 1)) for _ in range(rng.randint(0, 5)))
        return Raw(b"A", struct.pack(">I", len(items)) + items)
    return Raw(b"F", table_bytes(random_table(rng, depth + 1)))


def _encoded(v: Raw) -> bytes:
    return v.kind + v.data


def table_bytes(values: dict[Any, Raw]) -> bytes:
    items = b""
    for key, v in values.items():
        raw = key.encode() if isinstance(key, str) else key
        items += struct.pack("B", len(raw)) + raw + _encoded(v)
    return struct.pack(">I", len(items)) + items


def _key(rng: random.Random) -> str | bytes:
    r = rng.random()
    if r < 0.7:
        return f"k{rng.randrange(10**6)}"
    if r < 0.8:
        return ""
    if r < 0.9:
        return "ключ-" + "x" * rng.choice([1, 200])
    return b"\xff\xfe" + bytes([rng.randrange(256)])


def random_table(rng: random.Random, depth: int = 0) -> dict[Any, Raw]:
    return {_key(rng): field_value(rng, depth) for _ in range(rng.randint(0, 6))}


# Our own headers, forged ----------------------------------------------------------------------
def _forged(rng: random.Random, name: str, names: Names) -> Raw:
    ints = [0, -1, 1, 2, 3, 7, 999, 2**31 - 1, 2**63 - 1, -(2**63)]
    strings = [
        b"",
        b"2",
        b"abc",
        b"0001-01-01T00:00:00+00:00",
        b"9999-12-31T23:59:59.999999+00:00",
        b"9999-12-31T23:59:59-23:59",
        b"0001-01-01T00:00:00+23:59",
        b"2020-02-30T00:00:00",
        b"1969-07-20T20:17:40Z",
        b"\xff\xfe",
        str(rng.randint(1, 5)).encode(),  # a parked-id that likely names a real row
        str(uuid.uuid4()).encode(),
        names.work_exchange.encode(),
        b"adv.work",
        b"#",
        b"x" * 300,
    ]
    r = rng.random()
    if r < 0.35:
        return Raw(b"l", struct.pack(">q", rng.choice(ints)))
    if r < 0.45:
        return Raw(b"I", struct.pack(">i", rng.choice([0, -5, 2, 2**31 - 1])))
    if r < 0.85:
        return Raw(b"S", longstr(rng.choice(strings)))
    if r < 0.9:
        return Raw(b"T", struct.pack(">Q", rng.choice(TIMESTAMPS)))
    return field_value(rng, 3)


def forged_headers(rng: random.Random, names: Names, queues: dict[str, str]) -> dict[Any, Raw]:
    out: dict[Any, Raw] = {}
    for name in rng.sample(RESERVED, rng.randint(1, 4)):
        out[names.header(name)] = _forged(rng, name, names)
    if rng.random() < 0.3:  # a target header naming a sibling's queue
        out[names.target_header] = Raw(b"S", longstr(rng.choice(list(queues.values()))))
    if rng.random() < 0.2:
        out["x-delivery-count"] = Raw(b"l", struct.pack(">q", rng.choice([0, 19, 50, -1])))
    return out


# Bodies ----------------------------------------------------------------------------------------
def _outcome(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.45:
        return {}
    if r < 0.65:
        return {"fail": rng.choice([1, 2])}
    if r < 0.85:
        return {"fail": "always"}
    if r < 0.93:
        return {"reject": True}
    return {"fail": "always", "only": [rng.choice(["adv_a", "adv_b"])]}


def body_for(rng: random.Random, token: str, big_budget: list[int]) -> tuple[bytes, dict, str]:
    """Body bytes, content properties, and a word for the kind of body."""
    doc = {"id": token, **_outcome(rng)}
    text = json.dumps(doc).encode()
    fail_mark = b" !FAIL" if doc.get("fail") == "always" else b""
    r = rng.random()
    if r < 0.35:
        ct = rng.choice([JSON, JSON + "; charset=utf-8", "application/vnd.adv+json"])
        return text, {"content_type": ct}, "json"
    if r < 0.42:
        huge = "9" * rng.choice([5000, 50_000])
        return f'{{"id": "{token}", "n": {huge}}}'.encode(), {"content_type": JSON}, "json-huge-int"
    if r < 0.48:
        return f'{{"id": "{token}", oops'.encode(), {"content_type": JSON}, "json-invalid"
    if r < 0.54:
        return (
            f'{{"id": "{token}", "x": "'.encode() + b"\xff\xfe\xc3" + b'"}',
            {"content_type": rng.choice([JSON, "text/plain; charset=utf-8"])},
            "invalid-utf8",
        )
    if r < 0.62:
        props = {"content_type": rng.choice([JSON, None]), "content_encoding": "gzip"}
        return gzip.compress(text), props, "gzip"
    if r < 0.65:
        return text, {"content_type": JSON, "content_encoding": "gzip"}, "gzip-not-gzipped"
    if r < 0.69:
        return b"", {"content_type": rng.choice([JSON, None, "text/plain"])}, "empty"
    if r < 0.72 and big_budget[0] > 0:
        big_budget[0] -= 1
        size = rng.choice([256 * 1024, 1024 * 1024, 3 * 1024 * 1024])
        doc["pad"] = "p" * size
        return json.dumps(doc).encode(), {"content_type": JSON}, f"large-{size}"
    if r < 0.80:
        return (
            f"plain {token}".encode() + fail_mark,
            {"content_type": rng.choice(["text/plain", "text/plain; charset=utf-16", "text/csv"])},
            "text",
        )
    if r < 0.86:
        return bytes([0, 1, 2, 255]) + token.encode() + fail_mark, {}, "binary-no-type"
    if r < 0.93:
        ct = rng.choice(
            [
                "",
                "application/x-python-pickle",
                "application/json; charset=bogus",
                "application/json; charset=latin-1",
                "ÿ/ÿ",
                b"\xff/json",
                "a" * 255,
            ]
        )
        return text, {"content_type": ct}, "odd-content-type"
    enc = rng.choice(["identity", "utf-8", "base64", "zlib", "br", "x" * 200])
    return text, {"content_type": JSON, "content_encoding": enc}, f"content-encoding {enc[:20]}"


# Properties --------------------------------------------------------------------------------
def properties(rng: random.Random, token: str, body: bytes) -> tuple[dict[str, Any], list[str]]:
    kind: list[str] = []
    p: dict[str, Any] = {}
    r = rng.random()
    if r < 0.7:
        p["message_id"] = token
    elif r < 0.8:
        p["message_id"] = _text(rng, rng.choice([0, 30, 255]))
        kind.append("odd message_id")
    elif r < 0.9:
        p["message_id"] = "reused-id"  # one id for many messages (an idempotency key)
        kind.append("reused message_id")
    if token_in(body, token) is False and p.get("message_id") != token:
        p["message_id"] = token  # an opaque body needs the token somewhere we can read it
    if rng.random() < 0.3:
        p["delivery_mode"] = rng.choice([1, 2, 1, 2, 1, 2, 1, 2, 0, 255])
    if rng.random() < 0.2:
        p["priority"] = rng.randrange(256)
    for name in ("correlation_id", "reply_to", "type", "app_id", "cluster_id"):
        if rng.random() < 0.12:
            p[name] = _text(rng, rng.choice([0, 10, 255]))
            kind.append(name)
    if rng.random() < 0.3:
        p["timestamp"] = rng.choice(TIMESTAMPS)
        kind.append(f"timestamp {p['timestamp']}")
    if rng.random() < 0.04:
        p["expiration"] = rng.choice(["86400000", "abc", "-1", ""])
        kind.append(f"expiration {p['expiration']!r}")
    if rng.random() < 0.03:
        p["user_id"] = rng.choice(["guest", "mallory"])
        kind.append(f"user_id {p['user_id']}")
    return p, kind


def token_in(body: bytes, token: str) -> bool:
    if token.encode() in body:
        return True
    if body[:2] == b"\x1f\x8b":
        try:
            return token.encode() in gzip.decompress(body)
        except OSError:
            return False
    return False


# Python-valued headers for the pika client (values pika can encode) ---------------------------
def pika_value(rng: random.Random, depth: int = 0) -> Any:
    from datetime import datetime, timezone
    from decimal import Decimal

    choices: list[Any] = [
        True,
        False,
        0,
        -(2**63),
        2**63 - 1,
        2**31,
        Decimal("1.25"),
        Decimal("-0.001"),
        "text é€",
        "",
        b"\xff\x00",
        None,
        datetime(1970, 1, 1, tzinfo=timezone.utc),
        datetime(2999, 12, 31, tzinfo=timezone.utc),
    ]
    if depth < 3:
        choices += [
            [pika_value(rng, depth + 1) for _ in range(3)],
            {"n": pika_value(rng, depth + 1)},
        ]
    return rng.choice(choices)


# Cases -----------------------------------------------------------------------------------------
def generate(
    seed: int, count: int, names: Names, queues: dict[str, str], *, cli: bool = True
) -> list[Case]:
    """``count`` random messages; ``queues`` maps "a"/"g" to the receiver queue names."""
    rng = random.Random(seed)
    big_budget = [3]
    cases: list[Case] = []
    for n in range(count):
        token = f"AV{seed}N{n}Z"
        body, content, body_kind = body_for(rng, token, big_budget)
        props, kind = properties(rng, token, body)
        props.update({k: v for k, v in content.items() if v is not None})
        kind.insert(0, body_kind)
        target = rng.choice(["a", "a", "g", "work", "other"])
        r = rng.random()
        client = "raw"
        headers: dict[Any, Raw] = {}
        pika_headers = None
        if r < 0.12:
            client = "pika"
            pika_headers = {f"p{i}": pika_value(rng) for i in range(rng.randint(0, 4))}
            if rng.random() < 0.3:
                pika_headers[names.header(rng.choice(RESERVED))] = rng.choice(
                    [-1, 2**40, "9999-12-31T23:59:59+00:00", "1", None, 2.5]
                )
            kind.append("pika headers")
        elif r < 0.2 and cli and token_in(body, token):
            client = "cli"  # strings only, no message_id: the token must be in the body
            pika_headers = {
                f"c{i}": "".join(rng.choice("abcé€ :-") for _ in range(8)) for i in range(2)
            }
            if rng.random() < 0.5:
                pika_headers[names.header(rng.choice(RESERVED))] = rng.choice(
                    ["7", "-1", "abc", "9999-12-31T23:59:59+00:00", "1", "adv.work"]
                )
            kind.append("amqp-publish")
        else:
            r2 = rng.random()
            if r2 < 0.35:
                pass
            elif r2 < 0.75:
                headers = random_table(rng)
                kind.append("random headers")
            else:
                headers = {**random_table(rng), **forged_headers(rng, names, queues)}
                kind.append("forged reserved headers")
            r3 = rng.random()
            if r3 < 0.03:
                depth = rng.choice([40, 300, 3000])
                headers["deep"] = nested(depth)
                kind.append(f"nested {depth}")
            elif r3 < 0.05:
                headers["weird"] = Raw(rng.choice([b"Z", b"L", b"U"]), b"\x00" * 8)
                kind.append("odd type letter")
            elif r3 < 0.07:
                headers.update({f"many{i}": Raw(b"l", struct.pack(">q", i)) for i in range(2000)})
                kind.append("2000 headers")
            elif r3 < 0.09:
                headers["long"] = Raw(b"S", longstr(b"L" * 200_000))
                kind.append("200 kB header")
        if headers:
            props["headers"] = headers
        cases.append(Case(n, token, target, client, body, props, pika_headers, kind))
    return cases
