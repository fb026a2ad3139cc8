"""Make pika survive header tables it cannot decode.

Another client can publish headers nested thousands of levels deep (RabbitMQ accepts them) or
of a field type pika does not know. pika decodes content headers recursively inside the
connection's I/O, so such a message raised ``RecursionError`` there, killed the connection,
and came back at the head of the queue on every reconnect: a crash loop no receiver code
could stop. The top-level table decode used for properties is wrapped: an undecodable table
becomes ``{UNDECODABLE_HEADERS: reason}`` (its length prefix lets us skip it), and the
consumer parks the message as undecodable.
"""

from __future__ import annotations

import struct
import types
from typing import Any

import pika.data
import pika.exceptions as pex
import pika.spec

from ..core.envelope import UNDECODABLE_HEADERS


def install() -> None:
    """Wrap the header-table decoder pika uses for properties (idempotent)."""
    if getattr(pika.spec.data, "_rmq_retry_guard", False):  # type: ignore[attr-defined]
        return
    original = pika.data.decode_table

    def decode_table(encoded: bytes, offset: int) -> tuple[dict[str, Any], int]:
        try:
            return original(encoded, offset)
        except (RecursionError, pex.InvalidFieldTypeException, struct.error, ValueError) as exc:
            size = struct.unpack_from(">I", encoded, offset)[0]
            reason = (
                "headers nested too deeply to decode"
                if isinstance(exc, RecursionError)
                else f"headers cannot be decoded ({type(exc).__name__}: {exc})"
            )
            return {UNDECODABLE_HEADERS: reason[:200]}, offset + 4 + size

    guarded = types.ModuleType(pika.data.__name__)
    guarded.__dict__.update(vars(pika.data))
    guarded.decode_table = decode_table  # type: ignore[attr-defined]
    guarded._rmq_retry_guard = True  # type: ignore[attr-defined]
    pika.spec.data = guarded  # type: ignore[attr-defined]
