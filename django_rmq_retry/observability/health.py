"""Liveness and readiness of a consumer, from its I/O loop's turns.

*Live*: the loop turned within ``timeout`` seconds. A receiver that hangs does not make a
consumer dead (receivers run in threads; the loop goes on settling the others), but a loop
stuck in a callback, a deadlock or a blocked I/O call does: then nothing is acked, heartbeats
stop, and only a restart helps. So does an ``async def`` receiver that has blocked the event
loop of the async receivers for ``timeout`` seconds (``time.sleep`` in ``async def``: every
other one waits): the watchdog (``consumer.watchdog``) names it, :attr:`Health.blocked_by`.
*Ready*: live, and consuming every queue it was asked to (not while connecting,
reconnecting, resuming a cancelled consumer or shutting down).

Over HTTP (``server.py``) or as files for exec probes: ``live`` is touched at most once a
second while the loop turns, ``ready`` exists while ready. Under ``--processes N`` each child
writes ``live-<pid>``/``ready-<pid>`` in a directory the supervisor watches
(:class:`ChildrenHealth`): the supervisor is live and ready when all of its children are.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.touch()


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


class Health:
    """One consumer process's health, fed by ``loop_tick``."""

    def __init__(
        self, timeout: float, directory: str | os.PathLike[str] | None = None, suffix: str = ""
    ) -> None:
        self.timeout = float(timeout)
        self._beat = time.monotonic()  # starting counts as a turn: the grace to connect
        #: The async receiver blocking its event loop, and since when (monotonic), if one is.
        self._blocked: tuple[str, float] | None = None
        self._ready = False
        self._touched = 0.0
        self._live_file = self._ready_file = None
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._live_file = Path(directory) / f"live{suffix}"
            self._ready_file = Path(directory) / f"ready{suffix}"
            _remove(self._ready_file)
            _touch(self._live_file)

    def loop_tick(self, ready: bool) -> None:
        """The I/O loop turned (the consumer's hook, through the observer)."""
        now = time.monotonic()
        self._beat = now
        if ready != self._ready:
            self._ready = ready
            if self._ready_file is not None:
                (_touch if ready else _remove)(self._ready_file)
        if self._live_file is not None and now - self._touched >= 1.0 and self.live():
            self._touched = now
            _touch(self._live_file)

    def loop_blocked(self, receiver: str | None, seconds: float) -> None:
        """An async receiver blocks its event loop (the watchdog, through the observer);
        ``seconds`` 0: the loop turns again."""
        since = time.monotonic() - seconds
        self._blocked = None if seconds <= 0 else (receiver or "?", since)

    @property
    def blocked_by(self) -> str | None:
        """The async receiver blocking its event loop now, if one is."""
        blocked = self._blocked
        return None if blocked is None else blocked[0]

    def stopped(self) -> None:
        """The consumer is gone: not ready, and its files say so."""
        self._ready = False
        if self._ready_file is not None:
            _remove(self._ready_file)

    def live(self) -> bool:
        now = time.monotonic()
        blocked = self._blocked
        if blocked is not None and now - blocked[1] >= self.timeout:
            return False
        return now - self._beat < self.timeout

    def ready(self) -> bool:
        return self._ready and self.live()


class ChildrenHealth:
    """The supervisor's view: every current child live (ready) by its files in ``directory``.

    A child that has not written its first file yet counts as live for ``timeout`` seconds
    from when it was first seen (starting Django takes a while), never as ready.
    """

    def __init__(self, directory: str, pids: Callable[[], list[int]], timeout: float) -> None:
        self.directory = Path(directory)
        self.pids = pids
        self.timeout = float(timeout)
        self._first_seen: dict[int, float] = {}

    def live(self) -> bool:
        now = time.time()
        pids = self.pids()
        if not pids:
            return False
        for pid in pids:
            try:
                beat = (self.directory / f"live-{pid}").stat().st_mtime
            except OSError:
                beat = self._first_seen.setdefault(pid, now)
            if now - beat >= self.timeout:
                return False
        return True

    def ready(self) -> bool:
        pids = self.pids()
        return (
            bool(pids)
            and all((self.directory / f"ready-{pid}").exists() for pid in pids)
            and self.live()
        )


class FileReporter:
    """Supervisor side of the file probes: every second, ``live``/``ready`` in ``directory``
    from a :class:`ChildrenHealth` (a daemon thread)."""

    def __init__(self, source: ChildrenHealth, directory: str) -> None:
        self._parent = Health(source.timeout, directory)
        self._source = source
        threading.Thread(target=self._run, name="rmq-health-files", daemon=True).start()

    def _run(self) -> None:
        while True:
            if self._source.live():
                self._parent.loop_tick(self._source.ready())
            else:
                self._parent.stopped()
            time.sleep(1.0)
