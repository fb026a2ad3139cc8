"""Message headers and properties in and out of database JSON columns (parked and outbox rows).

Every database's JSON column must store the values exactly, and the text columns must take
them (PostgreSQL refuses NUL characters in text and JSON, and NaN in JSON; SQLite stores
them), so a message is never unparkable (or unsendable) because of what it carries, and a
requeue publishes it as it came.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any


def text_column(value: str) -> str:
    """Text for a display/filter column. PostgreSQL refuses NUL characters in text, so they
    are shown as U+FFFD; the exact values live in the ``properties``/``headers`` JSON."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


#: In a parked row's properties: the header table's bytes as they arrived, and a digest of
#: the headers column they go with (an edited column no longer matches: its values win).
HEADERS_BYTES = "headers_bytes"
HEADERS_DIGEST = "headers_digest"


def properties_json(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Every set property but the headers (stored in a column of their own).

    Headers that remember their bytes (``envelope.RawHeaders``: a delivery's) leave those
    bytes here too, so a requeue sends the sender's entries exactly as they came."""
    props = {k: v for k, v in properties.items() if k != "headers" and v is not None}
    raw = getattr(properties.get("headers"), "raw", None)
    if isinstance(raw, bytes):
        props[HEADERS_BYTES] = raw
        props[HEADERS_DIGEST] = headers_digest(json_safe_headers(properties["headers"]))
    return json_safe_headers(props)


def headers_digest(stored: Mapping[str, Any]) -> str:
    """A digest of a headers column's JSON (key order and spacing aside)."""
    text = json.dumps(stored, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def json_safe_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers turned into values every database's JSON column stores exactly.

    Bytes become marked base64, datetimes ISO text, decimals text. Two more cases that
    SQLite stores but PostgreSQL refuses (which would leave a message unparkable): text
    holding NUL characters (marked base64 of its UTF-8) and NaN/infinite floats (marked
    text). A float PostgreSQL would store as another value is marked text too
    (:func:`_exact_in_json`). :func:`headers_from_json` turns every mark back into the
    original value.
    """
    return {_json_key(k): _json_safe(v) for k, v in (headers or {}).items()}


_KEY_MARK = "__b64key__:"
#: A key another client sent as bytes that are not UTF-8 (kept, so a requeue sends it as it came).
_BYTES_KEY_MARK = "__byteskey__:"


def _text_to_b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii")


def _b64_to_text(data: str) -> str:
    return base64.b64decode(data).decode("utf-8", "surrogatepass")


def _json_key(key: Any) -> str:
    if isinstance(key, bytes):
        return _BYTES_KEY_MARK + base64.b64encode(key).decode("ascii")
    text = str(key)
    if "\x00" in text or text.startswith((_KEY_MARK, _BYTES_KEY_MARK)):
        return _KEY_MARK + _text_to_b64(text)
    return text


def _key_back(key: str) -> str | bytes:
    if key.startswith(_KEY_MARK):
        return _b64_to_text(key[len(_KEY_MARK) :])
    if key.startswith(_BYTES_KEY_MARK):
        return base64.b64decode(key[len(_BYTES_KEY_MARK) :])
    return key


def _exact_in_json(value: float) -> bool:
    """Whether every database's JSON column gives ``value`` back as this same float.

    PostgreSQL refuses NaN and infinities, keeps no sign on zero (``-0.0``), and stores a
    number written with an exponent (``1e+300``, the form Python writes floats of 1e16 and
    more in) as the exact integer it equals, which reads back as an ``int``: the headers
    column would no longer be the one parked (its digest differs, and a requeue would send
    the values instead of the sender's bytes).
    """
    if not math.isfinite(value):
        return False
    text = repr(value)
    return "e+" not in text and text != "-0.0"


def _json_safe(value: Any) -> Any:
    if isinstance(value, str):
        return {"__text__": _text_to_b64(value)} if "\x00" in value else value
    if isinstance(value, float) and not _exact_in_json(value):
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


def headers_from_json(data: Mapping[str, Any] | None) -> dict[Any, Any]:
    """Inverse of :func:`json_safe_headers`.

    Plain values (text, numbers, booleans, null) under plain keys are taken as they are:
    every mark is a one-key table and every marked key starts with ``__``, and the outbox
    relay decodes a message's properties per row on its hot path.
    """
    return {
        (_key_back(k) if k.startswith("__") else k): (v if type(v) in _PLAIN else _from_json(v))
        for k, v in (data or {}).items()
    }


_PLAIN = frozenset({str, int, float, bool, type(None)})


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
