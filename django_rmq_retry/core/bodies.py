"""Bodies in and out by content type. Pure: standard library only.

Outgoing: ``bytes`` and ``str`` pass through, anything else becomes JSON. Incoming: a JSON
value, ``str`` for ``text/*``, the bytes themselves otherwise. Bodies are never unpickled or
evaluated, whatever the content type says.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from typing import Any

JSON_TYPES = ("application/json",)


class Undecodable(ValueError):
    """The body cannot be decoded as its content type says; the reason is user-facing."""


def encode_body(
    body: Any, content_type: str | None, encoder: type[json.JSONEncoder] | None = None
) -> tuple[bytes, str]:
    """Bytes and content type: bytes/str pass through, anything else becomes JSON."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), content_type or "application/octet-stream"
    if isinstance(body, str) and (content_type is None or not content_type.endswith("json")):
        return body.encode("utf-8"), content_type or "text/plain; charset=utf-8"
    try:
        data = json.dumps(body, cls=encoder, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"message body is not JSON serialisable: {exc}") from exc
    return data.encode("utf-8"), content_type or "application/json"


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


def is_json_type(mime: str) -> bool:
    return mime in JSON_TYPES or mime.endswith("+json")


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


def _text(body: bytes, charset: str) -> str:
    try:
        return body.decode(charset)
    except UnicodeDecodeError as exc:
        raise Undecodable(f"body is not valid {charset}: {exc.reason} at byte {exc.start}") from exc
    except UnicodeError as exc:
        raise Undecodable(f"body is not valid {charset}: {exc}") from exc


def decode_body(body: bytes, content_type: str | None, content_encoding: str | None) -> Any:
    """Decoded body: JSON value, ``str`` for ``text/*``, the bytes themselves otherwise.

    Raises :class:`Undecodable` with a one-line reason.
    """
    mime, params = parse_content_type(content_type)
    if is_json_type(mime):
        if not body:
            raise Undecodable(f"empty body with content type {mime}")
        text = _text(body, _charset(params, content_encoding))
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise Undecodable(
                f"body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from exc
        except RecursionError as exc:
            raise Undecodable("body is JSON nested too deeply to decode") from exc
    if mime.startswith("text/"):
        return _text(body, _charset(params, content_encoding))
    return body
