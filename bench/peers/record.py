"""What every benchmark worker writes, whatever runs it (ours, a peer, the raw twin).

* ``MARKFILE``: ``<epoch seconds> <pid>`` at the first call, and ``end <epoch seconds> <pid>
  <count>`` at the end (the time of the last *successful* call and how many there were), the
  format ``bench.common.run_timed`` reads: the figure is first call → last success.
* ``TIMESFILE`` (optional): JSON ``{"fail": {i: t}, "ok": {i: t}}``, the epoch time at which
  message ``i`` failed its first attempt and at which its retry succeeded. The benchmark
  computes each retry's lateness from it: ``ok - fail - requested delay``.

Standard library only: imported by ``manage.py rmq_consume`` (bench receivers), by the peers'
workers and by ``bench/raw.py``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path


class Recorder:
    def __init__(self, mark: str | None, times: str | None = None) -> None:
        self.mark = mark
        self.times = times
        self.marked = False
        self.count = 0
        self.last = 0.0
        self.fails: dict[int, float] = {}
        self.oks: dict[int, float] = {}
        self.finished = False
        self._lock = threading.Lock()  # workers with several threads (the I/O scenario)

    def first(self) -> None:
        """Call at the top of every call (only the first one writes)."""
        if self.marked:
            return
        self.marked = True
        if self.mark:
            with open(self.mark, "a") as fh:
                fh.write(f"{time.time()} {os.getpid()}\n")

    def failed(self, i: int) -> None:
        """Message ``i`` fails its first attempt now."""
        self.fails[i] = time.time()

    def ok(self, i: int | None = None) -> int:
        """A successful call (of message ``i``, kept when timing retries); the count so far."""
        with self._lock:
            self.last = time.time()
            if i is not None:
                self.oks[i] = self.last
            self.count += 1
            return self.count

    def finish(self) -> None:
        """Write the end line and the times (once; also safe from ``atexit``)."""
        if self.finished:
            return
        self.finished = True
        if self.mark and self.count:
            with open(self.mark, "a") as fh:
                fh.write(f"end {self.last} {os.getpid()} {self.count}\n")
        if self.times:
            with open(self.times, "w") as fh:
                json.dump({"fail": self.fails, "ok": self.oks}, fh)


def lateness(
    times: Path, delays: dict[int, float | None], label: str, first: int | None = None
) -> dict[int, float]:
    """Per message: second attempt − first failure − requested delay, in ms (checked: every
    message failed once and succeeded once, and message ``first``, if given, failed first)."""
    data = json.loads(times.read_text())
    fails = {int(k): v for k, v in data["fail"].items()}
    oks = {int(k): v for k, v in data["ok"].items()}
    if set(fails) != set(delays) or set(oks) != set(delays):
        raise RuntimeError(
            f"{label}: {len(fails)} first failures and {len(oks)} successes recorded for "
            f"{len(delays)} messages"
        )
    earliest = min(fails, key=fails.__getitem__)
    if first is not None and earliest != first:
        raise RuntimeError(f"{label}: message {earliest} failed first, not {first}")
    return {i: (oks[i] - fails[i] - (delays[i] or 0.0)) * 1000 for i in delays}
