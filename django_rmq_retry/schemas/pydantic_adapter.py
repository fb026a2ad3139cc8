"""The pydantic v2 adapter (``schemas``): imported only once a ``BaseModel`` schema exists.

pydantic reports every failing field at once; each becomes ``{"loc": [...], "msg": ...}``.
"""

from __future__ import annotations

from typing import Any

import pydantic

from ..core.errors import ValidationError


class PydanticAdapter:
    library = "pydantic"

    def __init__(self, schema: type[pydantic.BaseModel]) -> None:
        self.schema = schema
        try:  # its type hints resolved now, not per message
            schema.model_rebuild(raise_errors=True)
        except pydantic.PydanticUndefinedAnnotation as exc:
            raise NameError(str(exc)) from exc

    def validate(self, body: Any) -> Any:
        try:
            return self.schema.model_validate(body)
        except pydantic.ValidationError as exc:
            errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
            raise ValidationError(errors, self.schema.__name__) from None

    def is_instance(self, value: Any) -> bool:
        return isinstance(value, self.schema)

    def encode(self, instance: Any) -> bytes:
        return instance.model_dump_json().encode("utf-8")

    def json_schema(self) -> dict[str, Any]:
        return self.schema.model_json_schema()
