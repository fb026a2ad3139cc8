"""Edit a parked message, then requeue exactly one copy: the edited one.

The original row is kept as it was (body, headers); the edited copy goes out as a one-row
background operation (``parking.operations``: the consumers step it, the web request
publishes nothing) through :func:`~django_rmq_retry.parking.requeue` (claim, confirm,
mark: one copy, never the original and the edit). Edit once: while an edit of a row waits
to be sent, another is refused (never two edits on a double click or two operators'
submits); the row is marked requeued with an ``edited`` event in its history (who, when,
the diff) when its copy goes out.

What may be edited: the body (JSON validated when the content type says JSON; text in its
charset; raw bytes as hex, only when the body is not text, and only once the operator
accepts a warning), and the message's own headers (not ours, not the broker's ``x-``).
A body over the broker's maximum message size (``MAX_MESSAGE_BYTES``) is refused.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from ..conf import app_settings, current_names
from ..core.errors import ValidationError
from ..models import ParkedMessage, ParkedStatus, RequeueOperation
from ..registry import default_registry
from ..schemas import validate_for
from . import operations

JSON, TEXT, BYTES = "json", "text", "bytes"


class EditError(ValueError):
    """The edit cannot be sent; the message says why, for the operator. An edit of a typed
    message that does not fit its schema names each failing field in ``field_errors``
    (``[{"loc": [...], "msg": ...}]``), shown next to the JSON."""

    def __init__(self, message: str, field_errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or []


@dataclass(frozen=True)
class Editable:
    """A parked message as the edit form shows it."""

    kind: str  # json, text or bytes
    body: str
    headers: dict[str, Any]
    charset: str


@dataclass
class Edit:
    """A validated edit: the new body and headers, and what changed."""

    body: bytes
    headers: dict[str, Any]
    diff: str
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.diff)


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


def _is_json(content_type: str) -> bool:
    main = content_type.split(";")[0].strip().lower()
    return main == "application/json" or main.endswith("+json")


def _own_header(key: str) -> bool:
    """Headers an operator does not edit: ours (the prefix) and the broker's (``x-``)."""
    prefix = current_names().header("")
    return key.startswith(prefix) or key.lower().startswith("x-")


def editable(row: ParkedMessage) -> Editable:
    raw = bytes(row.body or b"")
    charset = _charset(row.content_type)
    headers = {k: v for k, v in (row.headers or {}).items() if not _own_header(k)}
    encoding = (row.properties or {}).get("content_encoding")
    if not encoding or encoding == "identity":
        try:
            text = raw.decode(charset)
        except (UnicodeDecodeError, LookupError):
            pass
        else:
            return Editable(JSON if _is_json(row.content_type) else TEXT, text, headers, charset)
    return Editable(BYTES, raw.hex(" ", 16) if raw else "", headers, charset)


def prepare(row: ParkedMessage, body: str, headers: str, *, accept_bytes: bool = False) -> Edit:
    """Validate an edit of ``row``; :class:`EditError` says what is wrong."""
    form = editable(row)
    warnings: list[str] = []
    if form.kind == BYTES:
        if not accept_bytes:
            raise EditError(
                "This body is not text: you are editing raw bytes (as hex). Tick the box to "
                "confirm; the receiver gets exactly these bytes."
            )
        try:
            new_body = bytes.fromhex("".join(body.split()))
        except ValueError as exc:
            raise EditError(f"The body is not valid hex: {exc}") from None
        warnings.append("Raw bytes edited: nothing checked their meaning.")
    else:
        if form.kind == JSON:
            try:
                decoded = json.loads(body)
            except ValueError as exc:
                raise EditError(f"The body is not valid JSON: {exc}") from None
            _check_schema(row, decoded, headers)
        try:
            new_body = body.encode(form.charset)
        except (UnicodeEncodeError, LookupError) as exc:
            raise EditError(f"The body cannot be encoded as {form.charset}: {exc}") from None
    limit = int(app_settings.MAX_MESSAGE_BYTES)
    if len(new_body) > limit:
        raise EditError(
            f"The body is {len(new_body):,} bytes, over the broker's maximum message size "
            f"({limit:,} bytes, MAX_MESSAGE_BYTES): it would be refused."
        )
    try:
        new_headers = json.loads(headers or "{}")
    except ValueError as exc:
        raise EditError(f"The headers are not valid JSON: {exc}") from None
    if not isinstance(new_headers, dict) or not all(isinstance(k, str) for k in new_headers):
        raise EditError("The headers must be a JSON object.")
    ours = sorted(k for k in new_headers if _own_header(k))
    if ours:
        raise EditError(f"These headers are not editable here: {', '.join(ours)}.")
    old_text = form.body
    new_text = body if form.kind != BYTES else new_body.hex(" ", 16)
    diff = _diff("body", old_text, new_text) + _diff(
        "headers", _pretty(form.headers), _pretty(new_headers)
    )
    return Edit(new_body, new_headers, diff, warnings)


def _check_schema(row: ParkedMessage, body: Any, headers: str) -> None:
    """A typed message's edit must fit the schema its receiver validates with (after the
    upcasters of the version its edited headers say): the consumer would park it as
    *invalid* otherwise. Untyped receivers, and receivers this process does not know,
    are not checked."""
    rec = default_registry.get(row.receiver)
    if rec is None:
        return
    try:
        new_headers = json.loads(headers or "{}")
    except ValueError:
        new_headers = {}  # (said once the headers are read below)
    try:
        validate_for(
            rec, row.routing_key, new_headers if isinstance(new_headers, dict) else {}, body
        )
    except ValidationError as exc:
        raise EditError(
            f"The edited body does not fit {exc.schema or 'its schema'}, the receiver's "
            "schema: it would be parked again as invalid.",
            exc.errors,
        ) from None


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _diff(name: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), f"{name} (parked)", f"{name} (edited)", lineterm=""
    )
    return "\n".join(lines) + ("\n" if old != new else "")


def requeue_edited(row: ParkedMessage, edit: Edit, *, user: str) -> RequeueOperation:
    """Start the one-row operation that sends the edited copy (exactly one, with confirms,
    in the background: the consumers step it) and marks the row requeued.

    The row's body and headers stay the original's; its history gets the ``edited`` event
    (who, when, the diff) when the copy is sent. :class:`EditError` if the row is not
    parked, or an edit of it waits to be sent (edit once: never a second copy).
    """
    old = {k for k in (row.headers or {}) if not _own_header(k)}
    headers: dict[str, Any] = dict.fromkeys(old - set(edit.headers))  # removed ones
    headers.update(edit.headers)
    try:
        return operations.create_edit(
            row.pk, user=user, body=edit.body, headers=headers, diff=edit.diff
        )
    except operations.EditRefused as exc:
        raise EditError(str(exc)) from None


def edit_waiting(row: ParkedMessage) -> str:
    """Why ``row`` cannot be edited now (``""``: it can)."""
    if row.status != ParkedStatus.PARKED:
        return "Only a parked message can be edited and requeued."
    op = operations.edit_in_flight(row.pk)
    if op is None:
        return ""
    return operations.edit_waits(op)
