"""Bodies in and out by content type. Pure: standard library only.

Outgoing: ``bytes`` and ``str`` pass through, anything else becomes strict JSON. Incoming:
the content encoding undone (gzip, deflate), then a JSON value, ``str`` for ``text/*``, the
bytes themselves otherwise. Bodies are never unpickled or evaluated, whatever the content
type says, and every refusal of a decoder is an :class:`Undecodable` with a readable reason.
"""

from __future__ import annotations

import codecs
import json
import math
import zlib
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
        data = json.dumps(
            body, cls=encoder, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
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


#: The most a compressed body may inflate to: RabbitMQ's own default largest message. A
#: small gzip body can hold gigabytes of zeros; past this it parks instead of exhausting memory.
MAX_INFLATED = 128 * 1024 * 1024

#: ``content_encoding`` values that leave the bytes as they are.
IDENTITY_ENCODINGS = frozenset({"", "identity", "binary", "7bit", "8bit"})

#: zlib window bits per compression we inflate: gzip framing, then zlib framing.
_COMPRESSIONS = {"gzip": 31, "x-gzip": 31, "deflate": 15}


def _not_a_json_constant(name: str) -> Any:
    raise Undecodable(f"body is not valid JSON: {name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise Undecodable(f"body is not valid JSON: number {text[:40]} is out of range")
    return value


#: Strict JSON (RFC 8259): ``NaN``/``Infinity``, and numbers too large for a float (which
#: Python would turn into ``inf``), are refused. The float check is a Python call per
#: float in the body; a body without floats decodes at the C scanner's full speed.
_JSON = json.JSONDecoder(parse_constant=_not_a_json_constant, parse_float=_finite)


def _charset(params: Mapping[str, str], hint: str | None) -> str:
    charset = params.get("charset") or hint or "utf-8"
    try:
        info = codecs.lookup(charset)
        # Bytes-to-bytes codecs (base64, zlib, ...) exist but ``bytes.decode`` refuses them
        # with LookupError; say so here, as Undecodable, not later as an internal error.
        if not getattr(info, "_is_text_encoding", True):
            raise LookupError(f"{charset!r} is not a text encoding")
    except LookupError as exc:
        raise Undecodable(f"unsupported charset {charset!r}") from exc
    return charset


def _text(body: bytes, charset: str) -> str:
    try:
        text = body.decode(charset)
    except UnicodeDecodeError as exc:
        raise Undecodable(f"body is not valid {charset}: {exc.reason} at byte {exc.start}") from exc
    except UnicodeError as exc:
        raise Undecodable(f"body is not valid {charset}: {exc}") from exc
    # A byte order mark is not part of the text (RFC 8259 lets a parser ignore it).
    return text[1:] if text.startswith("\ufeff") else text


def _inflate(body: bytes, name: str, wbits: int, limit: int) -> bytes:
    """The decompressed body: every gzip member, or one zlib (else raw deflate) stream."""
    out: list[bytes] = []
    size = 0
    data = body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            chunk = inflater.decompress(data, limit - size + 1)
        except zlib.error as exc:
            if wbits == 15 and not out:  # "deflate" sent without its zlib header
                return _inflate(body, name, -15, limit)
            raise Undecodable(f"body is not valid {name} data: {exc}") from exc
        size += len(chunk)
        out.append(chunk)
        if size > limit:
            raise Undecodable(f"{name} body inflates past {limit} bytes")
        if not inflater.eof:
            raise Undecodable(f"body is not valid {name} data: truncated")
        data = inflater.unused_data
        if wbits != 31 or not data.strip(b"\x00"):  # gzip members may follow each other
            return b"".join(out)


def unwrap(
    body: bytes, content_encoding: str | None, limit: int = MAX_INFLATED
) -> tuple[bytes, str | None]:
    """The body with its content encoding undone, and a charset the encoding names.

    ``gzip`` and ``deflate`` are inflated. Some clients (kombu, older ones) put a charset
    in ``content_encoding``; a text encoding's name is taken as the charset. Anything else
    is an encoding we cannot undo: the body is undecodable, whatever its type.
    """
    name = (content_encoding or "").strip().lower()
    if name in IDENTITY_ENCODINGS:
        return body, None
    if name in _COMPRESSIONS:
        return _inflate(body, name, _COMPRESSIONS[name], limit), None
    try:
        is_text = getattr(codecs.lookup(name), "_is_text_encoding", True)
    except LookupError:
        is_text = False
    if not is_text:
        raise Undecodable(f"unsupported content encoding {content_encoding!r}")
    return body, content_encoding


def _json(body: bytes, charset: str) -> Any:
    text = _text(body, charset)
    try:
        return _JSON.decode(text)
    except json.JSONDecodeError as exc:
        raise Undecodable(
            f"body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except RecursionError as exc:
        raise Undecodable("body is JSON nested too deeply to decode") from exc
    except ValueError as exc:
        if isinstance(exc, Undecodable):
            raise
        # Python's limit on digits in one integer (4300 by default).
        raise Undecodable(f"body is not JSON Python can decode: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    return str(exc).split(";")[0].splitlines()[0][:200] if str(exc) else type(exc).__name__


def decode_body(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None,
    *,
    max_inflated: int = MAX_INFLATED,
) -> Any:
    """Decoded body: JSON value, ``str`` for ``text/*``, the bytes themselves otherwise.

    A ``gzip``/``deflate`` content encoding is undone first. Raises :class:`Undecodable`
    with a one-line reason for anything a decoder refuses — never another exception, so a
    body can only ever park, not make the consumer give the message back.
    """
    try:
        if content_type is not None and not isinstance(content_type, str):
            raise Undecodable("property content_type is not text")
        if content_encoding is not None and not isinstance(content_encoding, str):
            raise Undecodable("property content_encoding is not text")
        mime, params = parse_content_type(content_type)
        data, hint = unwrap(body, content_encoding, max_inflated)
        if is_json_type(mime):
            if not data:
                raise Undecodable(f"empty body with content type {mime}")
            return _json(data, _charset(params, hint))
        if mime.startswith("text/"):
            return _text(data, _charset(params, hint))
        return data
    except Undecodable:
        raise
    except RecursionError as exc:
        raise Undecodable("body is nested too deeply to decode") from exc
    except Exception as exc:  # any decoder's refusal is the body's fault: park, never loop
        raise Undecodable(
            f"body cannot be decoded ({type(exc).__name__}: {_one_line(exc)})"
        ) from exc
