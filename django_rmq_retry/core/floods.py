"""Telling a flood of like events in a few lines: the first ones one by one, the rest counted.

Why: every parked message is worth a WARNING line, until a bad deploy parks 5,000 in a
minute and the one line that matters scrolls away among them. Per key (a receiver), the
first ``burst`` events of each ``interval`` are told one by one; the others are counted and
told as one summary when the interval has passed (:meth:`FloodSummary.due`) or when the
caller has nothing else to do (``due(everything=True)``, e.g. when the flood is over).

Pure: the caller passes the clock and does the logging.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

#: Events told one by one per key in each interval.
BURST = 10


@dataclass
class _Window:
    started: float
    told: int = 0
    counted: int = 0


@dataclass(frozen=True)
class Summary:
    """``count`` events of ``key`` were not told one by one in the last ``seconds``."""

    key: Hashable
    count: int
    seconds: float


class FloodSummary:
    """See the module docstring. ``interval <= 0`` tells every event (no summary)."""

    def __init__(
        self,
        interval: float,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = float(interval)
        self.burst = burst
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}

    def admit(self, key: Hashable) -> bool:
        """Whether to tell this event of ``key`` one by one (else it is counted)."""
        if self.interval <= 0:
            return True
        now = self._clock()
        window = self._windows.get(key)
        if window is None or (now - window.started >= self.interval and not window.counted):
            window = self._windows[key] = _Window(now)
        if window.told < self.burst:
            window.told += 1
            return True
        window.counted += 1
        return False

    def due(self, *, everything: bool = False) -> list[Summary]:
        """Summaries of the windows whose interval has passed that counted events (those
        windows start over, counting); with ``everything``, of every window, and all are
        forgotten (the flood is over: the next event is told one by one)."""
        now = self._clock()
        out = []
        for key, window in list(self._windows.items()):
            elapsed = now - window.started
            if not everything and elapsed < self.interval:
                continue
            if window.counted:
                out.append(Summary(key, window.counted, elapsed))
            if window.counted and not everything:
                # A flood under way keeps counting: its next window tells no line one by
                # one again (its burst was told) and starts now.
                self._windows[key] = _Window(now, told=self.burst)
            else:  # quiet, or the caller says the flood is over: the next event is told
                del self._windows[key]
        return out
