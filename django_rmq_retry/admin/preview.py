"""How a parked body is shown to an operator: pretty JSON, text, or a hex dump. Pure.

Nothing is ever unpickled or evaluated; the admin's templates escape what these return.
"""

from __future__ import annotations

import json

from ..core.bodies import Undecodable, is_json_type, parse_content_type, unwrap

#: Bytes of a body shown as text or JSON on the detail page; the rest is cut off.
BODY_PREVIEW_BYTES = 64 * 1024
#: Bytes of a binary body shown as a hex dump (a hex dump is ~5x the size of its input).
HEX_PREVIEW_BYTES = 16 * 1024


def hex_dump(data: bytes) -> str:
    """Offset, 16 bytes in hex, and their printable ASCII, one line per 16 bytes."""
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<47}  |{text}|")
    return "\n".join(lines)


def _decode_text(data: bytes, charset: str, truncated: bool) -> str | None:
    try:
        return data.decode(charset)
    except LookupError:
        return None
    except UnicodeDecodeError as exc:
        # A cut in the middle of a multi-byte character is not an encoding error.
        if truncated and exc.start >= len(data) - 4 and exc.reason.startswith("unexpected end"):
            return data[: exc.start].decode(charset, errors="strict")
        return None


def _looks_textual(text: str) -> bool:
    return not any(ord(c) < 32 and c not in "\t\n\r" for c in text)


def body_preview(
    body: bytes,
    content_type: str = "",
    content_encoding: str | None = None,
    *,
    limit: int = BODY_PREVIEW_BYTES,
    hex_limit: int = HEX_PREVIEW_BYTES,
) -> tuple[str, str, int]:
    """(kind, text, bytes shown) for a body: kind is "json", "text", "hex" or "empty".

    A ``gzip``/``deflate`` body is inflated first (up to ``4 * limit`` bytes; a larger one
    is shown as it came). JSON is pretty-printed when the whole body fits in ``limit``; a
    longer body is shown as text up to ``limit`` bytes; anything that does not decode as
    text becomes a hex dump of the first ``hex_limit`` bytes. Nothing is ever unpickled or
    evaluated.
    """
    if not body:
        return "empty", "", 0
    mime, params = parse_content_type(content_type)
    try:
        # A gzip/deflate body is shown inflated (if it inflates to a few pages at most).
        body, hint = unwrap(body, content_encoding, 4 * limit)
    except Undecodable:
        hint = None  # shown as it came
    charset = params.get("charset") or hint or "utf-8"
    truncated = len(body) > limit
    head = body[:limit]
    text = _decode_text(head, charset, truncated)
    if text is not None and (
        mime.startswith("text/") or is_json_type(mime) or _looks_textual(text)
    ):
        if not truncated and (is_json_type(mime) or text.lstrip()[:1] in ("{", "[")):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                pass
            else:
                try:
                    return "json", json.dumps(value, indent=2, ensure_ascii=False), len(body)
                except (ValueError, RecursionError):
                    pass
        return "text", text, len(head)
    shown = body[:hex_limit]
    return "hex", hex_dump(shown), len(shown)
