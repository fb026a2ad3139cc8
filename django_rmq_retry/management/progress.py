"""Progress of a long command, written to the command's own stream (``self.stderr``).

Why not a bar everywhere: a ``\\r``-redrawn bar is what a person at a terminal wants, and
garbage in a log file, a CI job or ``kubectl logs`` (one huge line of carriage returns). So
the stream decides: on a terminal the bar is redrawn in place at most ``REDRAWS_PER_SECOND``
times a second; anywhere else a plain line is written every ``every`` seconds and once at
the end. Nothing here touches ``sys.stderr`` or a logger: the command passes its own
``OutputWrapper`` (``call_command(..., stderr=buf)`` captures it, ``--no-color`` applies).

Reusable by any command that walks a known number of items (requeue, and operations that
ramp or rate-limit a requeue): ``update(done, detail)`` as often as convenient, ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

REDRAWS_PER_SECOND = 10
BAR_WIDTH = 30


class Stream(Protocol):
    """What Django's ``OutputWrapper`` offers (``self.stdout`` / ``self.stderr``)."""

    def write(self, msg: str = "", style_func: Callable[[str], str] | None = None, ending: str | None = None) -> None: ...  # fmt: skip

    def flush(self) -> None: ...

    def isatty(self) -> bool: ...


def _plain(text: str) -> str:
    return text


class Progress:
    """A progress report of ``total`` items on ``out``; see the module docstring."""

    def __init__(
        self,
        out: Stream,
        total: int,
        *,
        label: str = "",
        enabled: bool = True,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.total = max(int(total), 0)
        self.label = label
        self.enabled = enabled
        self.tty = enabled and out.isatty()
        self.every = every
        self._clock = clock
        self._last_at: float | None = None
        self._last_line = ""
        self._drawn = False

    def _line(self, done: int, detail: str) -> str:
        shown = min(done, self.total) if self.total else done
        prefix = f"{self.label} " if self.label else ""
        tail = f" {detail}" if detail else ""
        if self.tty and self.total:
            filled = int(BAR_WIDTH * shown / self.total)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            return f"{prefix}[{bar}] {done:,}/{self.total:,}{tail}"
        pct = f" ({100 * shown // self.total}%)" if self.total else ""
        return f"{prefix}{done:,}/{self.total:,}{pct}{tail}"

    def update(self, done: int, detail: str = "") -> None:
        """Report ``done`` items so far; written only when it is time to (see above)."""
        if not self.enabled:
            return
        now = self._clock()
        interval = 1.0 / REDRAWS_PER_SECOND if self.tty else self.every
        finished = self.total and done >= self.total
        if self._last_at is not None and now - self._last_at < interval and not finished:
            return
        line = self._line(done, detail)
        if line == self._last_line:
            return
        self._last_at = now
        self._last_line = line
        if self.tty:
            self.out.write("\r" + line, style_func=_plain, ending="")
            self._drawn = True
        else:
            self.out.write(line, style_func=_plain)
        self.out.flush()

    def close(self, done: int | None = None, detail: str = "") -> None:
        """The last report (``done`` when given), and the bar's line ended on a terminal."""
        if not self.enabled:
            return
        if done is not None:
            line = self._line(done, detail)
            if line != self._last_line:
                self._last_line = line
                if self.tty:
                    self.out.write("\r" + line, style_func=_plain, ending="")
                    self._drawn = True
                else:
                    self.out.write(line, style_func=_plain)
        if self._drawn:
            self.out.write("", style_func=_plain)  # end the redrawn line
            self._drawn = False
        self.out.flush()
