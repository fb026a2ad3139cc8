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
from functools import lru_cache
from types import CodeType, TracebackType

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


def error_text(exc: BaseException) -> str:
    """The exception's message, whole; a broken ``__str__`` must not break the retry path."""
    try:
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def error_summary(exc: BaseException, limit: int) -> str:
    """One line: the exception's message, truncated. Never a traceback."""
    return truncate(" ".join(error_text(exc).split()), limit)


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def traceback_text(exc: BaseException) -> str:
    """The formatted traceback, for the parked row: what ``traceback.format_exception``
    prints, with each frame formatted once per process (:func:`_frame_text`).

    Formatting a frame reads its source line and, since Python 3.11, parses it to place the
    ``^^^`` markers: costly per frame, most of a parked message's cost when a bad deploy
    parks thousands of messages a second, all failing in the same few places.
    """
    try:
        return "".join(_chain(exc, set()))
    except Exception:  # never lose a parking over its traceback: the plain way then
        return "".join(traceback.TracebackException.from_exception(exc).format())


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
#: Frames shown when one line calls itself again and again (as ``traceback`` does).
_RECURSIVE_CUTOFF = 3


def _chain(exc: BaseException, seen: set[int]) -> list[str]:
    """The lines of ``exc`` after those of the exception it came from (cause or context)."""
    seen.add(id(exc))
    if sys.version_info >= (3, 11) and isinstance(exc, BaseExceptionGroup):  # noqa: F821
        return list(traceback.TracebackException.from_exception(exc).format())
    lines: list[str] = []
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and id(cause) not in seen:
        lines += [*_chain(cause, seen), _CAUSE]
    elif context is not None and not exc.__suppress_context__ and id(context) not in seen:
        lines += [*_chain(context, seen), _CONTEXT]
    if exc.__traceback__ is not None:
        lines.append("Traceback (most recent call last):\n")
        lines += _frames(exc.__traceback__)
    lines += _exception_only(exc)
    return lines


def _exception_only(exc: BaseException) -> list[str]:
    """The last line(s): ``module.Type: message``. The plain case is written here (the
    standard library builds a whole ``TracebackException`` for it); a syntax error, notes
    or a failing ``__str__`` go through ``traceback``."""
    klass = type(exc)
    if isinstance(exc, SyntaxError) or getattr(exc, "__notes__", None) is not None:
        return traceback.format_exception_only(klass, exc)
    try:
        text = str(exc)
    except Exception:
        return traceback.format_exception_only(klass, exc)
    name, module = klass.__qualname__, klass.__module__
    if module not in ("__main__", "builtins"):
        name = f"{module if isinstance(module, str) else '<unknown>'}.{name}"
    return [f"{name}: {text}\n" if text else f"{name}\n"]


def _frames(tb: TracebackType | None) -> list[str]:
    lines: list[str] = []
    last: tuple[str, int, str] | None = None
    count = 0
    while tb is not None:
        code = tb.tb_frame.f_code
        where = (code.co_filename, tb.tb_lineno, code.co_name)
        if where != last:
            if count > _RECURSIVE_CUTOFF:
                lines.append(_repeated(count - _RECURSIVE_CUTOFF))
            last, count = where, 0
        count += 1
        if count <= _RECURSIVE_CUTOFF:
            lines.append(_frame_text(tb))
        tb = tb.tb_next
    if count > _RECURSIVE_CUTOFF:
        lines.append(_repeated(count - _RECURSIVE_CUTOFF))
    return lines


def _repeated(count: int) -> str:
    return f"  [Previous line repeated {count} more time{'s' if count > 1 else ''}]\n"


#: Formatted frames by (code, instruction, line): bounded, emptied when full.
_FRAME_TEXTS: dict[tuple[CodeType, int, int], str] = {}
_FRAME_TEXTS_MAX = 4096


def _frame_text(tb: TracebackType) -> str:
    """One frame as ``traceback`` formats it, computed once per code location.

    The text depends only on the code object, the instruction (its line and column span)
    and the file's source, which does not change under a running process.
    """
    key = (tb.tb_frame.f_code, tb.tb_lasti, tb.tb_lineno)
    text = _FRAME_TEXTS.get(key)
    if text is None:
        text = "".join(traceback.extract_tb(tb, limit=1).format())
        if len(_FRAME_TEXTS) >= _FRAME_TEXTS_MAX:
            _FRAME_TEXTS.clear()
        _FRAME_TEXTS[key] = text
    return text


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


@lru_cache(maxsize=4096)
def is_project_file(filename: str, roots: tuple[str, ...]) -> bool:
    """Whether ``filename`` is the project's own code (cached: a failing message's frames
    are the same few files again and again)."""
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
    return f"{error_type} at {_shown_name(filename, base)}:{function}"[:255]


@lru_cache(maxsize=4096)
def _shown_name(filename: str, base: str) -> str:
    """The file as a failure group names it: relative to the project's base directory, or
    its bare name (line numbers and absolute paths would split a group across deploys)."""
    if base and os.path.abspath(filename).startswith(os.path.abspath(base) + os.sep):
        return os.path.relpath(filename, base)
    return os.path.basename(filename)


def frames_of(tb: TracebackType | None) -> list[tuple[str, str]]:
    """(filename, function) per frame, outermost first.

    ``walk_tb``, not ``extract_tb``: the group needs no source lines, and reading them
    (a ``stat`` per file, column positions per frame) was a tenth of a parked message's cost.
    """
    return [(f.f_code.co_filename, f.f_code.co_name) for f, _lineno in traceback.walk_tb(tb)]
