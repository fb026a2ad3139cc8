"""The parked row's codec: a stored message's properties back as they were parked
(the JSON column codec itself is the core's ``json_columns``, shared with the outbox)."""

from __future__ import annotations

from typing import Any, Protocol

from ..core.envelope import RawHeaders
from ..core.json_columns import (
    HEADERS_BYTES,
    HEADERS_DIGEST,
    headers_digest,
    headers_from_json,
    json_safe_headers,
    properties_json,
    text_column,
)

__all__ = [
    "headers_from_json",
    "json_safe_headers",
    "properties_json",
    "row_properties",
    "text_column",
]


class StoredMessage(Protocol):
    """What a row must hold to be published again (a ``ParkedMessage``, or the tuple a
    requeue reads)."""

    @property
    def properties(self) -> dict[str, Any]: ...

    @property
    def headers(self) -> dict[str, Any]: ...


def row_properties(row: StoredMessage) -> dict[str, Any]:
    """The stored message's properties, headers included, exactly as it was parked.

    The header table's bytes, kept when it was parked, come back with the headers
    (``RawHeaders``): a requeue sends the sender's entries as they came. If the headers
    column was changed since, its values are what is sent."""
    props = headers_from_json(row.properties)
    raw = props.pop(HEADERS_BYTES, None)
    digest = props.pop(HEADERS_DIGEST, None)
    headers = headers_from_json(row.headers)
    if isinstance(raw, bytes) and digest == headers_digest(row.headers or {}):
        props["headers"] = RawHeaders(headers, raw=raw)
    else:
        props["headers"] = headers
    return props
