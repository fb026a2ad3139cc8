"""Who blocks the event loop of ``async def`` receivers: named in a WARNING while it does.

An ``async def`` receiver that calls something blocking (``time.sleep``, a synchronous
HTTP client, the ORM without ``sync_to_async``) stops the whole event loop: every other
receiver on it waits, nothing is handed back, and nothing says why. So the loop stamps each
turn (a timer every ``TURN`` seconds, on the loop itself), and a daemon thread looks at the
stamp. Once it is older than ``BLOCKED_AFTER``, the watchdog takes the loop thread's stack
(``sys._current_frames()``, CPython's documented hook for watchdogs and debuggers), finds the
innermost frame of a receiver in it, and logs one WARNING naming the receiver and its line;
when the loop turns again it says how long it was blocked. Observability hears both
(``hooks.loop_blocked``): the consumer's liveness fails while one receiver has blocked the
loop for longer than the liveness timeout, and names it.

It costs a timer callback a tenth of a second on the loop, and a thread that wakes as often.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
import time
from collections.abc import Iterable
from types import CodeType, FrameType
from typing import Any

from .. import hooks

logger = logging.getLogger("django_rmq_retry.consumer")

#: Seconds between two stamps of the loop, and between two looks at the stamp.
TURN = 0.1
#: A stamp older than this (seconds) means something blocks the loop.
BLOCKED_AFTER = 0.5


def receiver_codes(receivers: Iterable[Any]) -> dict[CodeType, str]:
    """The code object of each receiver's function (decorators unwrapped), by name."""
    found: dict[CodeType, str] = {}
    for rec in receivers:
        code = getattr(inspect.unwrap(rec.func), "__code__", None)
        if isinstance(code, CodeType):
            found[code] = rec.name
    return found


def blocker(frame: FrameType | None, codes: dict[CodeType, str]) -> tuple[str | None, str, int]:
    """Who runs at ``frame`` (a thread's innermost frame): the innermost receiver in its
    stack and its line, else None and the innermost frame's own place."""
    place = ("?", 0) if frame is None else (frame.f_code.co_filename, frame.f_lineno)
    while frame is not None:
        name = codes.get(frame.f_code)
        if name is not None:
            return name, frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None, *place


class LoopWatchdog:
    """Watches one event loop from a daemon thread; started on the loop's own thread (by
    :meth:`start`, called there), stopped by :meth:`stop` from any thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        codes: dict[CodeType, str],
        name: str,
        *,
        stalls: str = "every other async receiver waits",
    ):
        self._loop = loop
        self._stalls = stalls  # what the WARNING says waits meanwhile
        self._codes = codes
        self._name = name
        self._stamp = time.monotonic()
        self._ident = 0
        self._stopped = threading.Event()
        self._blocked_by: str | None = None  # what the last WARNING named, while blocked
        self._longest = 0.0  # seconds the loop has been blocked so far, while blocked

    def start(self) -> None:
        """On the loop's thread, once the loop runs (or is about to)."""
        self._ident = threading.get_ident()
        self._stamp = time.monotonic()
        self._loop.call_soon(self._turn)
        threading.Thread(target=self._watch, name=f"{self._name}-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _turn(self) -> None:
        self._stamp = time.monotonic()
        if not self._stopped.is_set():
            self._loop.call_later(TURN, self._turn)

    def _watch(self) -> None:
        while not self._stopped.wait(TURN):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """One look at the stamp (the watchdog's thread)."""
        late = now - self._stamp
        if late > BLOCKED_AFTER:
            if self._blocked_by is None:
                frame = sys._current_frames().get(self._ident)
                name, filename, line = blocker(frame, self._codes)
                self._blocked_by = name or "?"
                logger.warning(
                    "async receiver %s blocks the event loop (%.1fs so far) at %s:%d: %s; "
                    "call blocking code through sync_to_async",
                    name or "(unknown: no receiver on the loop's stack)",
                    late,
                    filename,
                    line,
                    self._stalls,
                )
            self._longest = late
            _tell(self._blocked_by, late)
        elif self._blocked_by is not None:
            logger.warning(
                "async receiver %s let the event loop go after %.1fs or more",
                self._blocked_by,
                self._longest,
            )
            self._blocked_by = None
            _tell(None, 0.0)


def _tell(name: str | None, seconds: float) -> None:
    current = hooks.current
    if current is not None:
        try:
            current.loop_blocked(name, seconds)
        except Exception:  # observability never stops a consumer
            logger.debug("the loop_blocked hook failed", exc_info=True)
