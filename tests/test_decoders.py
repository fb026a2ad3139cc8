"""Every decoder's refusal is an undecodable park with a reason naming the value (issue 12.3).

Pure tests, no broker: the body decoder (``core.bodies``), the property and header-name
check (``core.undecodable``), pika's property decoding behind our header guard
(``broker.headerguard``, fed frames written by ``tests/faults/rawamqp.py``), and the row
codec that keeps the bytes. ``tests/test_adversary_decoding.py`` runs the same cases end to
end against the real broker.
"""

from __future__ import annotations

import codecs
import gzip
import json
import math
import struct
import zlib
from datetime import datetime, timezone
from typing import Any

import pika.spec
import pytest

from django_rmq_retry.broker import headerguard
from django_rmq_retry.core.bodies import Undecodable, decode_body, encode_body
from django_rmq_retry.core.envelope import UNDECODABLE_HEADERS, UndecodableHeaders, read_incoming
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.outcome import Park, Run, triage
from django_rmq_retry.core.undecodable import (
    RAW_HEADERS,
    RAW_ROUTING_KEY,
    TEXT_PROPERTIES,
    unreadable,
    without_headers,
)
from django_rmq_retry.parking.rows import headers_from_json, json_safe_headers
from tests.faults.rawamqp import PROPERTIES, Raw, nested, table

JSON = "application/json"
N = Names("p")


# Bodies -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (gzip.compress(b'{"a": 1}'), "gzip"),
        (gzip.compress(b'{"a": 1}'), "x-gzip"),
        (gzip.compress(b'{"a"') + gzip.compress(b": 1}"), "gzip"),  # two members
        (gzip.compress(b'{"a": 1}') + b"\x00\x00", "GZIP"),  # zero padding after it
        (zlib.compress(b'{"a": 1}'), "deflate"),
        (zlib.compress(b'{"a": 1}')[2:-4], "deflate"),  # raw deflate, no zlib header
        (b'{"a": 1}', "identity"),
        (b'{"a": 1}', "utf-8"),  # a charset where the encoding belongs (kombu does this)
        (b"\xef\xbb\xbf" + b'{"a": 1}', None),  # a UTF-8 byte order mark
    ],
)
def test_compressed_and_marked_json_bodies_decode(body, encoding):
    assert decode_body(body, JSON, encoding) == {"a": 1}


def test_compressed_bodies_of_any_type_are_inflated():
    assert decode_body(gzip.compress(b"\x00\xff"), "application/octet-stream", "gzip") == (
        b"\x00\xff"
    )
    assert decode_body(gzip.compress("é".encode()), "text/plain", "gzip") == "é"


@pytest.mark.parametrize(
    ("body", "ctype", "encoding", "reason"),
    [
        (b'{"n": ' + b"9" * 5000 + b"}", JSON, None, "for integer string conversion"),
        (b'{"v": NaN}', JSON, None, "NaN is not a JSON value"),
        (b'{"v": Infinity}', JSON, None, "Infinity is not a JSON value"),
        (b"[-Infinity]", JSON, None, "-Infinity is not a JSON value"),
        (b'{"v": 1e999}', JSON, None, "number 1e999 is out of range"),
        (b'{"v": -1E+400}', JSON, None, "number -1E+400 is out of range"),
        (b"[" + b"9" * 400 + b".5]", JSON, None, "out of range"),
        (b"{}", JSON, "gzip", "not valid gzip data"),
        (gzip.compress(b"{}")[:-6], JSON, "gzip", "not valid gzip data: truncated"),
        (gzip.compress(b"{}") + b"junk", JSON, "gzip", "not valid gzip data"),
        (b"{}", JSON, "deflate", "not valid deflate data"),
        (b"{}", JSON, "br", "unsupported content encoding 'br'"),
        (b"{}", "application/octet-stream", "base64", "unsupported content encoding 'base64'"),
        (b"{}", "text/plain; charset=nope", None, "unsupported charset 'nope'"),
        (b"{}", b"application/json\xff", None, "property content_type is not text"),
        (b"{}", JSON, b"gzip\xff", "property content_encoding is not text"),
        (b'{"a": "\xff"}', JSON, None, "not valid utf-8"),
        (b"[" * 100_000 + b"]" * 100_000, JSON, None, "nested too deeply"),
    ],
)
def test_every_body_a_decoder_refuses_is_undecodable_with_a_reason(body, ctype, encoding, reason):
    with pytest.raises(Undecodable) as caught:
        decode_body(body, ctype, encoding)
    assert reason in str(caught.value)


def test_a_compressed_body_may_not_inflate_past_the_limit():
    bomb = gzip.compress(b"\x00" * 1_000_001)
    assert len(bomb) < 2_000
    with pytest.raises(Undecodable, match="inflates past 1000000 bytes"):
        decode_body(bomb, "application/octet-stream", "gzip", max_inflated=1_000_000)
    assert len(decode_body(bomb, "application/octet-stream", "gzip")) == 1_000_001


def test_floats_in_range_are_untouched():
    assert decode_body(b'{"v": 1e308, "w": 1.5e-300, "s": "1e999"}', JSON, None) == {
        "v": 1e308,
        "w": 1.5e-300,
        "s": "1e999",
    }


def _failing_codec(name: str) -> codecs.CodecInfo | None:
    if name != "rmq_retry_test_broken":
        return None

    def decode(data: Any, errors: str = "strict") -> tuple[str, int]:
        raise RuntimeError("this codec is broken")

    return codecs.CodecInfo(name=name, encode=codecs.utf_8_encode, decode=decode)


def test_any_exception_of_any_decoder_is_undecodable_not_an_internal_error():
    codecs.register(_failing_codec)
    try:
        with pytest.raises(Undecodable, match="RuntimeError: this codec is broken"):
            decode_body(b"x", "text/plain; charset=rmq_retry_test_broken", None)
    finally:
        codecs.unregister(_failing_codec)


def test_we_never_send_json_our_consumer_would_park():
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(TypeError, match="not JSON serialisable"):
            encode_body({"v": value}, None)


# Properties, header names, routing keys ---------------------------------------------------
@pytest.mark.parametrize("name", TEXT_PROPERTIES)
def test_a_property_that_is_not_utf8_is_named(name):
    props = {"content_type": JSON, name: b"\xff\xfeX"}
    assert unreadable(props) == f"property {name} is not UTF-8 text: b'\\xff\\xfeX'"
    verdict = triage(read_incoming({}, "", "q", N), b"{}", props)
    assert isinstance(verdict, Park) and verdict.reason.value == "undecodable"
    assert name in verdict.detail


def test_header_names_that_are_not_utf8_are_found_at_any_depth():
    assert unreadable({"headers": {"a": 1, "b": [{"c": {b"\xffk": 1}}]}}) == (
        "header key b'\\xffk' is not UTF-8 text"
    )
    # Values may be bytes: AMQP long strings and byte arrays are binary.
    assert unreadable({"headers": {"a": b"\xff", "b": [b"\x00"], "c": {"d": "é"}}}) is None


def test_a_routing_key_that_is_not_utf8_is_named():
    assert unreadable({RAW_ROUTING_KEY: b"work.\xff"}) == (
        "routing key is not UTF-8 text: b'work.\\xff'"
    )


def test_an_ordinary_delivery_is_run():
    props = {"content_type": JSON, "message_id": "m", "headers": {"k": b"\xff", "d": {"x": 1}}}
    assert isinstance(triage(read_incoming(props["headers"], "", "q", N), b"{}", props), Run)


def test_undecodable_headers_keep_their_bytes_in_the_row_properties():
    marked = UndecodableHeaders({UNDECODABLE_HEADERS: "why", RAW_HEADERS: b"\x00\x00\x00\x00"})
    kept = without_headers({"message_id": "m", "headers": marked})
    assert kept == {"message_id": "m", "headers": {}, RAW_HEADERS: b"\x00\x00\x00\x00"}
    assert without_headers({"headers": {"a": 1}}) == {"headers": {}}


def test_only_the_header_guard_can_mark_headers_undecodable():
    forged = {UNDECODABLE_HEADERS: "forged", RAW_HEADERS: b"\x00"}
    assert read_incoming(forged, "", "q", N).undecodable is None
    props = {"content_type": JSON, "headers": forged}
    assert isinstance(triage(read_incoming(forged, "", "q", N), b"{}", props), Run)
    assert without_headers(props)["headers"] == {} and RAW_HEADERS not in without_headers(props)
    marked = UndecodableHeaders({UNDECODABLE_HEADERS: "why"})
    assert read_incoming(marked, "", "q", N).undecodable == "why"


def test_the_row_codec_keeps_header_names_that_are_bytes():
    headers = {b"\xffk": {b"\x00": 1}, "__byteskey__:x": 2, "plain": b"\xff"}
    stored = json.loads(json.dumps(json_safe_headers(headers)))
    assert headers_from_json(stored) == headers


# pika behind the header guard -------------------------------------------------------------
def properties_frame(headers: dict[str, Any] | Raw, **props: Any) -> bytes:
    """The property part of a content header frame, written by the spec-level client."""
    flags, data = 0, b""
    values = {"headers": headers, **props}
    for name, bit, encode in PROPERTIES:
        if name in values:
            flags |= 1 << bit
            value = values[name]
            data += value.data if isinstance(value, Raw) else encode(value)
    return struct.pack(">H", flags) + data


def decoded(headers: dict[str, Any] | Raw) -> pika.spec.BasicProperties:
    headerguard.install()
    frame = properties_frame(headers, message_id="after", app_id="app")
    props = pika.spec.BasicProperties()
    with headerguard.decoding():  # as our connections' I/O does
        props.decode(frame)
    # The properties after the headers are read from the right place.
    assert (props.message_id, props.app_id) == ("after", "app")
    return props


def ts(seconds: int, fmt: str = ">Q") -> Raw:
    return Raw(b"T", struct.pack(fmt, seconds))


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"born": ts(-86400, ">q")}, "'born': timestamp 18446744073709465216 (signed: -86400)"),
        ({"born": ts(253402300800)}, "'born': timestamp 253402300800 seconds is out of"),
        ({"ok": 1, "meta": {"k": 1, "at": ts(2**63)}}, "'meta' > 'at': timestamp"),
        ({"dates": [ts(0), ts(2**64 - 1)]}, "'dates' [1]: timestamp"),
        ({"t": {"list": [1, {"deep": [ts(2**62)]}]}}, "'t' > 'list' [1] > 'deep' [0]: timestamp"),
        ({"v": Raw(b"Z", b"")}, "'v': field type b'Z' value cannot be decoded"),
        ({"deep": nested(5000)}, "'deep' > 'n' > 'n'"),
    ],
)
def test_a_header_table_pika_refuses_is_marked_with_a_reason_naming_the_value(headers, reason):
    props = decoded(headers)
    assert isinstance(props.headers, UndecodableHeaders)
    assert set(props.headers) == {UNDECODABLE_HEADERS, RAW_HEADERS}
    assert reason in props.headers[UNDECODABLE_HEADERS]
    assert props.headers[RAW_HEADERS] == table(headers)


def test_floats_and_doubles_arrive_as_the_floats_they_encode():
    """pika 1.4 reads them as integers (2.5 as 2, 1.8e308 as a 309-digit integer it could
    never send again); on our connections they are floats, infinities and NaN included."""
    props = decoded(
        {
            "v": Raw(b"d", struct.pack(">d", 1.7976931348623157e308)),
            "a": [1, {"f": Raw(b"f", struct.pack(">f", 2.5))}],
            "inf": Raw(b"d", struct.pack(">d", math.inf)),
            "nan": Raw(b"f", struct.pack(">f", math.nan)),
            "w": 2**63 - 1,
        }
    )
    assert UNDECODABLE_HEADERS not in props.headers
    assert props.headers["v"] == 1.7976931348623157e308
    assert props.headers["a"] == [1, {"f": 2.5}] and type(props.headers["a"][1]["f"]) is float
    assert props.headers["inf"] == math.inf and math.isnan(props.headers["nan"])
    assert props.headers["w"] == 2**63 - 1


def test_inner_lengths_that_run_past_the_table_are_caught():
    inner = b"\x01aS" + struct.pack(">I", 20) + b"ab"  # a long string claiming 20 bytes
    raw = Raw(b"", struct.pack(">I", len(inner)) + inner)
    props = decoded(raw)
    assert "lengths disagree" in props.headers[UNDECODABLE_HEADERS]


def test_odd_but_decodable_headers_pass_untouched():
    headers = {
        "epoch": ts(0),
        "dec": Raw(b"D", struct.pack(">Bi", 255, 7)),
        "bin": Raw(b"x", struct.pack(">I", 2) + b"\x00\xff"),
        "nested": nested(50),
    }
    props = decoded(headers)
    assert props.headers["epoch"] == datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert props.headers["bin"] == b"\x00\xff"
    assert UNDECODABLE_HEADERS not in props.headers
