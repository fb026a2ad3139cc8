"""Pure tests of header handling and body decoding."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from django_rmq_retry.core.bodies import Undecodable, decode_body
from django_rmq_retry.core.envelope import (
    MAX_ATTEMPT,
    came_through_us,
    clean_headers,
    fresh_headers,
    read_incoming,
    requeue_properties,
    retry_properties,
    valid_first_failure,
)
from django_rmq_retry.core.failure import Failure, error_summary
from django_rmq_retry.core.names import Names
from django_rmq_retry.parking.rows import headers_from_json, json_safe_headers

N = Names("p")


@pytest.mark.parametrize(
    ("value", "expected", "warns"),
    [
        (None, 1, False),
        (3, 3, False),
        ("4", 4, False),
        ("four", 1, True),
        (-2, 1, True),
        (0, 1, True),
        ([1, 2], 1, True),
        (True, 1, True),
        (MAX_ATTEMPT, MAX_ATTEMPT, False),
        (MAX_ATTEMPT + 1, 1, True),
        (10**30, 1, True),
        ("٣", 1, True),  # a digit, but not an ASCII one
    ],
)
def test_read_attempt_never_trusts_a_bad_header(value, expected, warns):
    # Read from a copy that came back through our deliver exchange (see the route tests).
    headers = {} if value is None else {"p-attempt": value}
    envelope = read_incoming(headers, "p.deliver", "", N)
    assert envelope.attempt == expected
    assert bool(envelope.warning) is warns


def test_broker_headers_are_dropped():
    headers = {
        "x-death": [{}],
        "x-first-death-queue": "q",
        "x-last-death-reason": "expired",
        "x-delivery-count": 2,
        "x-acquired-count": 1,
        "CC": ["a"],
        "tenant": "acme",
    }
    assert clean_headers(headers) == {"tenant": "acme"}


def _props(**extra):
    base = {
        "content_type": "application/json",
        "content_encoding": None,
        "headers": {"tenant": "acme", "x-death": [{"count": 1}]},
        "delivery_mode": 2,
        "priority": 5,
        "correlation_id": "corr",
        "reply_to": "replies",
        "expiration": "60000",
        "message_id": "m1",
        "timestamp": 1700000000,
        "type": "order",
        "user_id": "guest",
        "app_id": "shop",
        "cluster_id": None,
    }
    base.update(extra)
    return base


def test_retry_copy_keeps_every_property_and_adds_ours():
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    props = retry_properties(
        _props(),
        names=N,
        attempt=2,
        failure=Failure("ValueError", "bad", at),
        exchange="p.work",
        routing_key="shop.order.paid",
        target_queue="p.rec",
        due_us=122_400,
    )
    for key in (
        "content_type",
        "priority",
        "correlation_id",
        "reply_to",
        "message_id",
        "timestamp",
        "type",
        "app_id",
    ):
        assert props[key] == _props()[key]
    h = props["headers"]
    assert h["tenant"] == "acme" and "x-death" not in h
    assert h["p-attempt"] == 2 and h["p-error-type"] == "ValueError" and h["p-error"] == "bad"
    assert h["p-original-routing-key"] == "shop.order.paid" and h["p-target"] == "p.rec"
    assert h["p-first-failure"] == h["p-last-failure"]
    assert (h["p-due"], h["p-due-us"]) == (123, 122_400)  # ms rounded up; the µs kept
    # expiration/user_id would break the delay path: kept in headers instead
    assert props["expiration"] is None and props["user_id"] is None
    assert h["p-original-expiration"] == "60000" and h["p-original-user-id"] == "guest"
    assert not any(k.startswith("x-") for k in h)


def test_first_failure_time_survives_later_retries():
    first = retry_properties(
        _props(),
        names=N,
        attempt=2,
        failure=Failure("E", "m", datetime(2026, 1, 1, tzinfo=timezone.utc)),
        exchange="e",
        routing_key="r",
        target_queue="q",
        due_us=0,
    )
    # The handler reads the copy when it comes back, and passes on the checked time.
    back = read_incoming(first["headers"], "p.deliver", "", N)
    second = retry_properties(
        first,
        names=N,
        attempt=3,
        failure=Failure("E", "m", datetime(2026, 1, 2, tzinfo=timezone.utc)),
        exchange="e",
        routing_key="r",
        target_queue="q",
        due_us=0,
        first_failure=back.first_failure,
    )
    assert second["headers"]["p-first-failure"].startswith("2026-01-01")
    assert second["headers"]["p-last-failure"].startswith("2026-01-02")


def test_requeue_copy_resets_attempts_and_counts_requeues():
    headers = {"p-attempt": 5, "p-error": "x", "p-target": "old", "tenant": "acme"}
    props = requeue_properties(
        _props(headers=headers),
        names=N,
        exchange="p.work",
        routing_key="rk",
        target_queue="p.rec",
        parked_id=17,
        requeue_count=2,
    )
    h = props["headers"]
    assert "p-attempt" not in h and "p-error" not in h
    assert h["p-requeued"] == 2 and h["p-parked-id"] == "17" and h["p-target"] == "p.rec"
    assert h["tenant"] == "acme"


def test_original_route_prefers_our_headers():
    h = {"p-original-exchange": "p.work", "p-original-routing-key": "shop.x"}
    routed = read_incoming(h, "p.delay.00", "0.0.1", N)
    assert (routed.exchange, routed.routing_key) == ("p.work", "shop.x")
    direct = read_incoming({}, "p.work", "shop.y", N)
    assert (direct.exchange, direct.routing_key) == ("p.work", "shop.y")


@pytest.mark.parametrize(
    ("body", "ctype", "expected"),
    [
        (b'{"a": 1}', "application/json", {"a": 1}),
        (b'{"a": 1}', "application/vnd.api+json", {"a": 1}),
        ("é".encode("latin-1"), "text/plain; charset=latin-1", "é"),
        (b"hello", "text/plain", "hello"),
        (b"\x00\xff", "application/octet-stream", b"\x00\xff"),
        (b"\x00\xff", None, b"\x00\xff"),
    ],
)
def test_decode_body(body, ctype, expected):
    assert decode_body(body, ctype, None) == expected


@pytest.mark.parametrize(
    ("body", "ctype", "encoding", "reason"),
    [
        (b"not json", "application/json", None, "not valid JSON"),
        (b"", "application/json", None, "empty body"),
        (b'"\xff"', "application/json", None, "not valid utf-8"),
        (b"\xff", "text/plain", None, "not valid utf-8"),
        (b"{}", "application/json", "br", "unsupported content encoding"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", None, "nested too deeply"),
    ],
)
def test_undecodable_bodies_have_a_readable_reason(body, ctype, encoding, reason):
    with pytest.raises(Undecodable, match=reason):
        decode_body(body, ctype, encoding)


def test_error_summary_is_one_truncated_line():
    text = error_summary(ValueError("line one\nline two " + "x" * 1000), 50)
    assert "\n" not in text and len(text) == 50 and text.endswith("…")


def test_error_summary_survives_a_broken_str():
    class Weird(Exception):
        def __str__(self):
            raise RuntimeError

    assert error_summary(Weird(), 100) == "<unprintable Weird>"


def test_headers_round_trip_through_json():
    headers = {
        "b": b"\x00\x01",
        "d": datetime(2026, 1, 1, tzinfo=timezone.utc),
        "n": Decimal("1.5"),
        "nested": {"list": [1, b"x"]},
        "nul\x00key": "nul\x00value",
        "__b64key__:looks-marked": 1,
        "inf": float("inf"),
        # Tables that look like our own marks come back as tables, not decoded.
        "fake-bytes": {"__bytes__": "AAE="},
        "fake-table": {"__table__": {"x": 1}},
        "fake-text": [{"__text__": "eA=="}],
    }
    stored = json_safe_headers(headers)
    assert "\x00" not in json.dumps(stored)  # PostgreSQL refuses NUL in JSON text
    assert headers_from_json(json.loads(json.dumps(stored))) == headers


def test_nan_survives_the_json_column():
    stored = json.loads(json.dumps(json_safe_headers({"nan": float("nan")}), allow_nan=False))
    assert math.isnan(headers_from_json(stored)["nan"])


# Our headers are untrusted input (issue #12) --------------------------------------------
@pytest.mark.parametrize(
    ("exchange", "ours"),
    [
        ("p.deliver", True),
        ("p.orphans", True),
        ("p.delay.00", True),
        ("p.delay.22", True),
        ("p.work", False),
        ("", False),
        ("p.delay.0", False),
        ("p.delay.001", False),
        ("q.deliver", False),
        ("other", False),
    ],
)
def test_only_our_own_routes_count_as_ours(exchange, ours):
    assert came_through_us(exchange, N) is ours


def test_retry_headers_on_a_message_published_to_the_work_exchange_are_ignored():
    # Forwarded from another message (tracing) or forged: a fresh message starts at 1, at its
    # own routing key, with no first failure of someone else's.
    forged = {
        "p-attempt": 7,
        "p-first-failure": "2024-01-01T00:00:00+00:00",
        "p-original-exchange": "p.work",
        "p-original-routing-key": "shop.other",
        "tenant": "acme",
    }
    env = read_incoming(forged, "p.work", "shop.mine", N)
    assert (env.attempt, env.routing_key, env.first_failure) == (1, "shop.mine", None)
    assert env.via_us is False and "p-attempt" in (env.warning or "")
    back = read_incoming(forged, "p.delay.03", "0.0.1", N)
    assert (back.attempt, back.routing_key) == (7, "shop.other")
    assert back.first_failure == datetime(2024, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "value",
    [
        "0001-01-01T00:00:00+05:00",  # converting to UTC overflows
        "9999-12-31T23:59:59-05:00",  # likewise, the other way
        "0001-01-01T00:00:00+00:00",  # storable by some databases, not a plausible failure
        "9999-12-31T23:59:59+00:00",
        "2024-01-01T00:00:00",  # no offset: whose local time?
        "yesterday",
        "1700000000",
        "",
        "2024-01-01T00:00:00+00:00" + " " * 100,
        1700000000,
        ["2024-01-01T00:00:00+00:00"],
        None,
    ],
)
def test_a_first_failure_at_the_edge_of_the_calendar_is_ignored(value):
    assert valid_first_failure(value) is None
    env = read_incoming({"p-first-failure": value}, "p.deliver", "", N)
    assert env.first_failure is None


def test_a_plausible_first_failure_is_read_as_utc():
    at = valid_first_failure("2024-06-01T12:00:00+02:00")
    assert at == datetime(2024, 6, 1, 10, 0, tzinfo=timezone.utc)
    soon = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    assert valid_first_failure(soon) is not None  # clocks differ a little
    far = (datetime.now(timezone.utc) + timedelta(days=30)).isoformat()
    assert valid_first_failure(far) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("17", "17"),
        (b"17", "17"),
        ("0017", "0017"),
        ("²", None),  # str.isdigit() says yes, int() says no
        ("-1", None),
        ("1e3", None),
        ("9" * 19, None),  # beyond a 64-bit key
        (17, None),
        ("", None),
    ],
)
def test_a_parked_id_is_ascii_digits_that_fit_a_key(value, expected):
    assert read_incoming({"p-parked-id": value}, "p.deliver", "", N).parked_id == expected


@pytest.mark.parametrize(("value", "expected"), [(2, 2), ("3", 3), (-1, 0), (10**9, 0), ("x", 0)])
def test_a_requeue_count_is_range_checked(value, expected):
    assert read_incoming({"p-requeued": value}, "p.work", "rk", N).requeued == expected


def test_original_route_longer_than_amqp_allows_is_ignored():
    h = {"p-original-exchange": "p.work", "p-original-routing-key": "k" * 256}
    env = read_incoming(h, "p.deliver", "", N)
    assert (env.exchange, env.routing_key) == ("p.deliver", "")
    assert read_incoming({"p-target": "q" * 256}, "p.orphans", "", N).target is None
    assert read_incoming({"p-target": "p.q"}, "p.orphans", "", N).target == "p.q"


def test_retry_copy_carries_the_checked_first_failure_not_the_header_text():
    failure = Failure("E", "m", datetime(2025, 1, 2, tzinfo=timezone.utc))
    props = retry_properties(
        {"headers": {"p-first-failure": "0001-01-01T00:00:00+05:00"}},
        names=N,
        attempt=2,
        failure=failure,
        exchange="p.work",
        routing_key="rk",
        target_queue="p.q",
        due_us=0,
        first_failure=None,
    )
    assert props["headers"]["p-first-failure"] == "2025-01-02T00:00:00.000+00:00"


def test_fresh_messages_drop_reserved_and_broker_headers():
    forwarded = {
        "p-attempt": 3,
        "p-original-routing-key": "a.b",
        "p-parked-id": "9",
        "p-target": "p.q",
        "x-death": [{}],
        "x-first-death-queue": "q",
        "django-rmq-retry-undecodable-headers": "x",
        "traceparent": "00-abc",
        "pp-own": 1,
        "p_other": 2,
    }
    assert fresh_headers(forwarded, N) == {"traceparent": "00-abc", "pp-own": 1, "p_other": 2}
