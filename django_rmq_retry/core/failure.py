"""What went wrong, as text: error type and message for headers, traceback and failure group
for the parked row. Pure: standard library only.

The failure group (fingerprint) is the exception class plus the first frame in the project's
own code. The message text is left out on purpose so that "order 17 not found" and "order
18 not found" land in one group, and line numbers are left out so a deploy that shifts code
does not split a group.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Failure:
    """What went wrong on one attempt, as it will be written into headers."""

    error_type: str
    error_message: str
    at: datetime


def error_type_name(exc: BaseException) -> str:
    klass = type(exc)
    if klass.__module__ == "builtins":
        return klass.__qualname__
    return f"{klass.__module__}.{klass.__qualname__}"


def error_summary(exc: BaseException, limit: int) -> str:
    """One line: the exception's message, truncated. Never a traceback."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break the retry path
        text = f"<unprintable {type(exc).__name__}>"
    text = " ".join(text.split())
    return truncate(text, limit)


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def traceback_text(exc: BaseException) -> str:
    """The formatted traceback, for the parked row.

    ``lookup_lines=False``: source lines are read when formatted, from linecache, with no
    ``stat()`` of every file of the stack first (a tenth of a parked message's cost).
    """
    return "".join(
        traceback.TracebackException(type(exc), exc, exc.__traceback__, lookup_lines=False).format()
    )


def library_roots() -> tuple[str, ...]:
    """Directories whose files are never 'project code' (stdlib, site-packages, us)."""
    roots = {_PACKAGE_DIR}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.abspath(path))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        roots.add(os.path.join(os.path.abspath(prefix), "lib"))
    return tuple(sorted(roots))


def is_project_file(filename: str, roots: Iterable[str]) -> bool:
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep):
        return False
    return not any(path == r or path.startswith(r + os.sep) for r in roots)


def project_frame(
    frames: Iterable[tuple[str, str]], roots: Iterable[str]
) -> tuple[str, str] | None:
    """The innermost (filename, function) in project code, i.e. nearest to the raise."""
    roots = tuple(roots)
    found = None
    for filename, function in frames:
        if is_project_file(filename, roots):
            found = (filename, function)
    return found


def fingerprint(
    error_type: str, frames: Iterable[tuple[str, str]], roots: Iterable[str], base: str = ""
) -> str:
    frame = project_frame(frames, roots)
    if frame is None:
        return error_type[:255]
    filename, function = frame
    if base and os.path.abspath(filename).startswith(os.path.abspath(base) + os.sep):
        filename = os.path.relpath(filename, base)
    else:
        filename = os.path.basename(filename)
    return f"{error_type} at {filename}:{function}"[:255]


def frames_of(tb: TracebackType | None) -> list[tuple[str, str]]:
    """(filename, function) per frame, outermost first.

    ``walk_tb``, not ``extract_tb``: the group needs no source lines, and reading them
    (a ``stat`` per file, column positions per frame) was a tenth of a parked message's cost.
    """
    return [(f.f_code.co_filename, f.f_code.co_name) for f, _lineno in traceback.walk_tb(tb)]
