"""The parked row's traceback (``core.failure.traceback_text``): the text Python's own
``traceback.format_exception`` prints, built from frames formatted once per process. Pure:
no broker, no database."""

from __future__ import annotations

import sys
import traceback

import pytest

from django_rmq_retry.core import failure
from django_rmq_retry.core.errors import Reject


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _nested(depth: int) -> None:
    if depth:
        _nested(depth - 1)
    raise LookupError(f"order {depth} not found")


def _caught(fn, *args) -> BaseException:
    try:
        fn(*args)
    except BaseException as exc:
        return exc
    raise AssertionError("no exception")


def _throw(exc: BaseException) -> None:
    raise exc


def _recurse(n: int) -> int:
    return _recurse(n + 1)


def _chained_cause() -> None:
    try:
        _nested(2)
    except LookupError as exc:
        raise RuntimeError("wrapped") from exc


def _chained_context() -> None:
    try:
        {}["missing"]
    except KeyError:
        raise ValueError("while handling")  # noqa: B904 (the implicit context is the point)


def _suppressed() -> None:
    try:
        {}["missing"]
    except KeyError:
        raise ValueError("no context") from None


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("broken __str__")


def _noted() -> None:
    exc = ValueError("with a note")
    if sys.version_info >= (3, 11):
        exc.add_note("note: order 17")
    raise exc


CASES = {
    "plain": lambda: _caught(_nested, 3),
    "cause": lambda: _caught(_chained_cause),
    "context": lambda: _caught(_chained_context),
    "suppressed context": lambda: _caught(_suppressed),
    "recursion": lambda: _caught(_recurse, 0),
    "bad __str__": lambda: _caught(lambda: (_ for _ in ()).throw(_BadStr())),
    "syntax error": lambda: _caught(compile, "x = (", "<receiver>", "exec"),
    "note": lambda: _caught(_noted),
    "no traceback": lambda: KeyError("never raised"),
    "empty message": lambda: _caught(_throw, ValueError()),
    "a library's class": lambda: _caught(_throw, Reject("no sku")),
    "multi-line message": lambda: _caught(_throw, RuntimeError("line one\nline two")),
}
if sys.version_info >= (3, 11):
    CASES["exception group"] = lambda: _caught(
        lambda: (_ for _ in ()).throw(
            ExceptionGroup("two", [ValueError("a"), KeyError("b")])  # noqa: F821
        )
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_traceback_text_is_what_python_prints(case):
    exc = CASES[case]()
    expected = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert failure.traceback_text(exc) == expected
    assert failure.traceback_text(exc) == expected  # again, from the cached frames


def test_the_same_place_failing_again_reuses_its_formatted_frames(monkeypatch):
    failure._FRAME_TEXTS.clear()
    calls = []
    real = traceback.extract_tb
    monkeypatch.setattr(
        traceback, "extract_tb", lambda tb, limit=None: calls.append(1) or real(tb, limit)
    )
    first = failure.traceback_text(_caught(_nested, 2))
    formatted = len(calls)
    # _caught's frame, then _nested's call site (twice: formatted once) and its raise
    assert formatted == 3
    second = failure.traceback_text(_caught(_nested, 2))
    assert len(calls) == formatted and second == first
    assert "order 0 not found" in second


def test_a_full_cache_starts_over(monkeypatch):
    monkeypatch.setattr(failure, "_FRAME_TEXTS_MAX", 2)
    failure._FRAME_TEXTS.clear()
    exc = _caught(_nested, 5)
    assert failure.traceback_text(exc) == "".join(traceback.format_exception(exc))
    assert len(failure._FRAME_TEXTS) <= 2
