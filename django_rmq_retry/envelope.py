"""Headers and bodies in and out. Pure: standard library only.

AMQP properties travel here as a plain ``dict`` keyed by pika's ``BasicProperties`` attribute
names, so this module never imports pika. It answers three questions:

* what does an incoming delivery say (attempt number, original routing, decoded body)?
* what does the copy we publish for a retry look like?
* what does the copy we publish for a requeue look like?
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from .names import Names

#: Every AMQP basic property, by pika's attribute name.
PROPERTY_NAMES: tuple[str, ...] = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

#: Headers owned by the broker; never copied into a message we publish.
BROKER_HEADERS = frozenset({"x-death", "x-delivery-count", "x-acquired-count", "CC", "BCC"})
BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")

#: Stands in for a header table the AMQP client could not decode (see ``broker.py``).
UNDECODABLE_HEADERS = "django-rmq-retry-undecodable-headers"

#: The attempt number we accept from a header; anything above is treated as this.
MAX_ATTEMPT = 1_000_000

JSON_TYPES = ("application/json",)


class Undecodable(ValueError):
    """The body cannot be decoded as its content type says; the reason is user-facing."""


@dataclass(frozen=True)
class Failure:
    """What went wrong on one attempt, as it will be written into headers."""

    error_type: str
    error_message: str
    at: datetime


def is_broker_header(name: str) -> bool:
    return name in BROKER_HEADERS or name.startswith(BROKER_HEADER_PREFIXES)


def clean_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Caller headers minus the broker-owned ones (``x-death`` & co.)."""
    return {k: v for k, v in (headers or {}).items() if not is_broker_header(str(k))}


def read_attempt(headers: Mapping[str, Any] | None, names: Names) -> tuple[int, str | None]:
    """Attempt number of this delivery (1-based) and a warning if the header was bad.

    Missing means 1. A header that is not a positive integer (a string, a list, a negative
    number...) restarts the count at 1 rather than crash or loop; the warning says why.
    """
    raw = (headers or {}).get(names.header("attempt"))
    if raw is None:
        return 1, None
    if isinstance(raw, bool) or not isinstance(raw, int):
        if isinstance(raw, str | bytes) and raw.strip().isdigit():
            raw = int(raw)
        else:
            return 1, f"ignored malformed {names.header('attempt')} header {_short(raw)}"
    if raw < 1:
        return 1, f"ignored non-positive {names.header('attempt')} header {raw}"
    return min(raw, MAX_ATTEMPT), None


def read_int_header(headers: Mapping[str, Any] | None, name: str) -> int | None:
    raw = (headers or {}).get(name)
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str | bytes) and raw.strip().isdigit():
        return int(raw)
    return None


def read_str_header(headers: Mapping[str, Any] | None, name: str) -> str | None:
    raw = (headers or {}).get(name)
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return raw if isinstance(raw, str) else None


def original_route(
    headers: Mapping[str, Any] | None, exchange: str, routing_key: str, names: Names
) -> tuple[str, str]:
    """Exchange and routing key the message was first published with.

    Copies travelling through the delay levels carry a binary routing key, so the original
    is kept in our headers and read back from them.
    """
    ex = read_str_header(headers, names.header("original-exchange"))
    rk = read_str_header(headers, names.header("original-routing-key"))
    if ex is None or rk is None:
        return exchange, routing_key
    return ex, rk


def parse_content_type(value: str | None) -> tuple[str, dict[str, str]]:
    if not value:
        return "", {}
    mime, _, rest = value.partition(";")
    params: dict[str, str] = {}
    for part in rest.split(";"):
        key, sep, val = part.partition("=")
        if sep:
            params[key.strip().lower()] = val.strip().strip('"')
    return mime.strip().lower(), params


def _charset(params: Mapping[str, str], content_encoding: str | None) -> str:
    charset = params.get("charset") or content_encoding or "utf-8"
    try:
        info = codecs.lookup(charset)
        # Bytes-to-bytes codecs (base64, zlib, ...) exist but ``bytes.decode`` refuses them
        # with LookupError; say so here, as Undecodable, not later as an internal error.
        if not getattr(info, "_is_text_encoding", True):
            raise LookupError(f"{charset!r} is not a text encoding")
    except LookupError as exc:
        raise Undecodable(f"unsupported charset/content encoding {charset!r}") from exc
    return charset


def is_json_type(mime: str) -> bool:
    return mime in JSON_TYPES or mime.endswith("+json")


def decode_body(body: bytes, content_type: str | None, content_encoding: str | None) -> Any:
    """Decoded body: JSON value, ``str`` for ``text/*``, the bytes themselves otherwise.

    Raises :class:`Undecodable` with a one-line reason. Bodies are never unpickled or
    evaluated whatever the content type says.
    """
    mime, params = parse_content_type(content_type)
    if is_json_type(mime):
        if not body:
            raise Undecodable(f"empty body with content type {mime}")
        charset = _charset(params, content_encoding)
        try:
            text = body.decode(charset)
        except UnicodeDecodeError as exc:
            raise Undecodable(
                f"body is not valid {charset}: {exc.reason} at byte {exc.start}"
            ) from exc
        except UnicodeError as exc:
            raise Undecodable(f"body is not valid {charset}: {exc}") from exc
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise Undecodable(
                f"body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from exc
        except RecursionError as exc:
            raise Undecodable("body is JSON nested too deeply to decode") from exc
    if mime.startswith("text/"):
        charset = _charset(params, content_encoding)
        try:
            return body.decode(charset)
        except UnicodeDecodeError as exc:
            raise Undecodable(
                f"body is not valid {charset}: {exc.reason} at byte {exc.start}"
            ) from exc
        except UnicodeError as exc:
            raise Undecodable(f"body is not valid {charset}: {exc}") from exc
    return body


def error_type_name(exc: BaseException) -> str:
    klass = type(exc)
    if klass.__module__ == "builtins":
        return klass.__qualname__
    return f"{klass.__module__}.{klass.__qualname__}"


def error_summary(exc: BaseException, limit: int) -> str:
    """One line: the exception's message, truncated. Never a traceback."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break the retry path
        text = f"<unprintable {type(exc).__name__}>"
    text = " ".join(text.split())
    return truncate(text, limit)


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def iso(at: datetime) -> str:
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds")


def retry_properties(
    properties: Mapping[str, Any],
    *,
    names: Names,
    attempt: int,
    failure: Failure,
    exchange: str,
    routing_key: str,
    target_queue: str,
    due_ms: int,
) -> dict[str, Any]:
    """Properties of the copy published for the next attempt.

    Body and every property are kept except two that would break the delay path:
    ``expiration`` (a per-message TTL would cut the wait short and, on the receiver queue,
    drop the message) and ``user_id`` (the broker refuses a user id that is not ours). Both
    are kept in headers. Broker-owned headers are dropped: our counting never reads them.
    """
    props = {k: properties.get(k) for k in PROPERTY_NAMES if k != "headers"}
    headers = clean_headers(properties.get("headers"))
    h = names.header
    if props.get("expiration") is not None:
        headers[h("original-expiration")] = props["expiration"]
    if props.get("user_id") is not None:
        headers[h("original-user-id")] = props["user_id"]
    props["expiration"] = props["user_id"] = None
    first = read_str_header(headers, h("first-failure")) or iso(failure.at)
    headers.update(
        {
            h("attempt"): attempt,
            h("first-failure"): first,
            h("last-failure"): iso(failure.at),
            h("error-type"): failure.error_type,
            h("error"): failure.error_message,
            h("original-exchange"): exchange,
            h("original-routing-key"): routing_key,
            h("due"): due_ms,
            names.target_header: target_queue,
        }
    )
    props["headers"] = headers
    props["delivery_mode"] = 2
    return props


def requeue_properties(
    properties: Mapping[str, Any],
    *,
    names: Names,
    exchange: str,
    routing_key: str,
    target_queue: str | None,
    parked_id: int | str,
    requeue_count: int,
) -> dict[str, Any]:
    """Properties of a parked message sent back to work: attempts reset, history kept."""
    props = {k: properties.get(k) for k in PROPERTY_NAMES if k != "headers"}
    headers = clean_headers(properties.get("headers"))
    h = names.header
    for key in ("attempt", "due", "first-failure", "last-failure", "error-type", "error"):
        headers.pop(h(key), None)
    if props.get("user_id") is not None:
        headers[h("original-user-id")] = props["user_id"]
    props["expiration"] = props["user_id"] = None
    headers[h("original-exchange")] = exchange
    headers[h("original-routing-key")] = routing_key
    headers[h("requeued")] = requeue_count
    headers[h("parked-id")] = str(parked_id)
    if target_queue is None:
        headers.pop(names.target_header, None)
    else:
        headers[names.target_header] = target_queue
    props["headers"] = headers
    props["delivery_mode"] = 2
    return props


def _short(value: Any, limit: int = 60) -> str:
    return truncate(repr(value), limit)


def json_safe_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers turned into values every database's JSON column stores exactly.

    Bytes become marked base64, datetimes ISO text, decimals text. Two more cases that
    SQLite stores but PostgreSQL refuses (which would leave a message unparkable): text
    holding NUL characters (marked base64 of its UTF-8) and NaN/infinite floats (marked
    text). :func:`headers_from_json` turns every mark back into the original value.
    """
    return {_json_key(k): _json_safe(v) for k, v in (headers or {}).items()}


_KEY_MARK = "__b64key__:"


def _text_to_b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii")


def _b64_to_text(data: str) -> str:
    return base64.b64decode(data).decode("utf-8", "surrogatepass")


def _json_key(key: Any) -> str:
    text = str(key)
    if "\x00" in text or text.startswith(_KEY_MARK):
        return _KEY_MARK + _text_to_b64(text)
    return text


def _key_back(key: str) -> str:
    return _b64_to_text(key[len(_KEY_MARK) :]) if key.startswith(_KEY_MARK) else key


def _json_safe(value: Any) -> Any:
    if isinstance(value, str):
        return {"__text__": _text_to_b64(value)} if "\x00" in value else value
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    if isinstance(value, datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, Decimal):
        return {"__decimal__": str(value)}
    if isinstance(value, Mapping):
        table = {_json_key(k): _json_safe(v) for k, v in value.items()}
        if len(table) == 1 and next(iter(table)) in _RESERVED:
            return {_TABLE_MARK: table}  # a table that only looks like one of our marks
        return table
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def headers_from_json(data: Mapping[str, Any] | None) -> dict[str, Any]:
    """Inverse of :func:`json_safe_headers`."""
    return {_key_back(k): _from_json(v) for k, v in (data or {}).items()}


_TABLE_MARK = "__table__"
_MARKS: dict[str, Callable[[str], Any]] = {
    "__bytes__": base64.b64decode,
    "__datetime__": datetime.fromisoformat,
    "__decimal__": Decimal,
    "__text__": _b64_to_text,
    "__float__": float,
}
#: Keys a one-key table of the user's own must not be mistaken for (wrapped when stored).
_RESERVED = frozenset({*_MARKS, _TABLE_MARK})


def _from_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        if len(value) == 1:
            ((mark, inner),) = value.items()
            if mark in _MARKS and isinstance(inner, str):
                return _MARKS[mark](inner)
            if mark == _TABLE_MARK and isinstance(inner, Mapping):
                return {_key_back(k): _from_json(v) for k, v in inner.items()}
        return {_key_back(k): _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def delivery_digest(queue: str, message_id: Any, body: bytes, *extra: str) -> str:
    """A stable identity for one message in one queue: sha256 of queue, id, body and ``extra``.

    The same delivery redelivered gets the same digest, so it finds what an earlier delivery
    stored (the park key, the delivery-limit row). Changing how it is built re-keys rows
    already stored: a redelivery would then park twice.
    """
    parts = [queue, str(message_id or ""), hashlib.sha256(body).hexdigest(), *extra]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
