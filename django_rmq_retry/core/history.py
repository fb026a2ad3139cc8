"""A message's attempt history, carried in one small header of its own retry copies.

Each failed attempt adds one short record (when, host and process, how long it ran, the
exception and its first own frame, the delay chosen next). The list is bounded: the first
``KEEP_FIRST`` and the last ``KEEP_LAST`` records stay, the ones between go (their attempt
numbers show the gap), so a message that failed 10,000 times carries five records. The
header is optional: the frame budget drops it first when a copy does not fit. It survives a
requeue (a requeued copy keeps our headers), so the records of every round stay together.

Pure: standard library only; the consumer supplies the facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

KEEP_FIRST = 2
KEEP_LAST = 3
#: The exception and frame text kept per record (characters).
WHAT_MAX = 120
SEP = " | "
#: The fields of a record, in order.
FIELDS = ("attempt", "at", "where", "took", "what", "next")


def record(
    attempt: int,
    at: datetime,
    host: str,
    pid: int,
    took_ms: float,
    what: str,
    next_delay_s: float | None,
) -> str:
    """One attempt as one short string (``next_delay_s`` ``None``: parked after it)."""
    when = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    nxt = "parked" if next_delay_s is None else f"retry in {next_delay_s:g}s"
    what = what.replace("|", "/")[:WHAT_MAX]
    return SEP.join((str(attempt), when, f"{host}:{pid}", f"{took_ms:.0f}ms", what, nxt))


def add(existing: Any, new: str) -> list[str]:
    """``existing`` (the header's value, whatever came) with ``new`` added, bounded."""
    records = (
        [_text(r) for r in existing if isinstance(r, (str, bytes))]
        if isinstance(existing, (list, tuple))
        else []
    )
    records.append(new)
    if len(records) > KEEP_FIRST + KEEP_LAST:
        records = records[:KEEP_FIRST] + records[-KEEP_LAST:]
    return records


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def parse(records: Any) -> list[dict[str, str]]:
    """The records as dicts (for a page); malformed ones are kept as their text."""
    if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
        return []
    out = []
    for item in records:
        if not isinstance(item, (str, bytes)):
            continue
        parts = _text(item).split(SEP, len(FIELDS) - 1)
        if len(parts) != len(FIELDS):
            out.append({"what": _text(item)})
        else:
            out.append(dict(zip(FIELDS, parts, strict=True)))
    return out
