"""The msgspec adapter (``schemas``): imported only once a ``msgspec.Struct`` schema exists.

Validation is ``msgspec.convert`` of the decoded body (about a microsecond and a half for
a small event); msgspec stops at the first failing field and names it by a path such as
``$.items[0].sku``, turned here into ``loc`` ``["items", 0, "sku"]``.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ..core.errors import FieldError, ValidationError

_STEP = re.compile(r'\.([^.\[]+)|\[(\d+)\]|\["((?:[^"\\]|\\.)*)"\]')
_MISSING = re.compile(r"^Object missing required field `(.*)`$")


class MsgspecAdapter:
    library = "msgspec"

    def __init__(self, schema: type) -> None:
        self.schema = schema
        self._encoder = msgspec.json.Encoder()
        msgspec.inspect.type_info(schema)  # its type hints resolved now, not per message

    def validate(self, body: Any) -> Any:
        try:
            return msgspec.convert(body, self.schema)
        except msgspec.ValidationError as exc:
            raise ValidationError([field_error(str(exc))], self.schema.__name__) from None

    def is_instance(self, value: Any) -> bool:
        return isinstance(value, self.schema)

    def encode(self, instance: Any) -> bytes:
        return self._encoder.encode(instance)

    def json_schema(self) -> dict[str, Any]:
        return dict(msgspec.json.schema(self.schema))


def field_error(text: str) -> FieldError:
    """msgspec's error line as ``{"loc": [...], "msg": ...}``."""
    msg, sep, path = text.rpartition(" - at `")
    if not sep:
        msg, path = text, "$`"
    loc: list[Any] = []
    for name, index, quoted in _STEP.findall(path[1:].rstrip("`")):
        loc.append(int(index) if index else (quoted or name))
    missing = _MISSING.match(msg)
    if missing:
        loc.append(missing.group(1))
        msg = "Field required"
    return {"loc": loc, "msg": msg}
