"""``rmq_consume --processes N``: run N consumer processes and keep them running.

The supervisor never talks to RabbitMQ itself. It starts each consumer as a fresh
interpreter rather than forking, so no pika socket, thread or database connection is ever
shared with a child; database connections of the supervisor are closed before every start
all the same. A child starts the way the supervisor was started (:func:`entry_point`: the
project's ``manage.py`` with the same interpreter and options), so what ``manage.py`` does
before Django starts happens in every child too.

* A child that dies (non-zero exit, killed by a signal) is started again after a backoff
  that doubles while it keeps dying young (0.5 s up to 30 s) and starts over once a child
  has lived a while. Each death and restart is logged.
* A child that exits 0 finished on purpose (``--max-messages``, ``--max-idle-time``) and is
  not restarted.
* SIGTERM or SIGINT to the supervisor is forwarded once to every child, which shuts down
  warm (finishes in-flight messages); a second signal is forwarded again (cold exit).
  Children run in their own process group, so a Ctrl-C in a terminal reaches them only
  through the supervisor, and on Linux a child gets SIGTERM if the supervisor itself dies.
* The supervisor exits when every child has exited: 0 if all of them exited 0.
* With ``share``, child ``i`` of ``N`` gets its index in the environment
  (``core.spread.ENV``: ``i/N``, kept across its restarts), so the children subscribe
  first to different partitions of the ordered receivers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core.backoff import CappedBackoff
from ..core.spread import ENV as SHARE_ENV
from ..core.spread import Share
from .stop_signals import on_stop_signals

logger = logging.getLogger("django_rmq_retry.management.supervisor")

#: A child that lived at least this long is considered healthy: its backoff starts over.
HEALTHY_AFTER = 10.0
BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
POLL_INTERVAL = 0.1


@dataclass
class Slot:
    """One of the N consumer processes, across its restarts."""

    number: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff: CappedBackoff = field(
        default_factory=lambda: CappedBackoff(BACKOFF_START, BACKOFF_MAX)
    )
    restart_at: float | None = None
    restarts: int = 0
    finished: bool = False
    last_code: int | None = None
    history: list[int] = field(default_factory=list)


def entry_point(
    argv: Sequence[str] | None = None, orig_argv: Sequence[str] | None = None
) -> list[str] | None:
    """How this process was started, up to the command's name: the interpreter, its options
    and the script (``python -X dev manage.py``; ``python -m django``; ``django-admin``).

    A child started the same way runs what the project's ``manage.py`` does before Django
    starts (``.env`` loading, django-configurations, ``sys.path`` edits), which a bare
    ``python -m django`` skips. ``None`` when this process is not a command line whose
    sub-command is ``rmq_consume`` (``call_command`` inside a test or a script): the caller
    falls back to ``python -m django``.
    """
    argv = list(sys.argv if argv is None else argv)
    orig = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
    if len(argv) < 2 or argv[1] != "rmq_consume" or len(orig) < len(argv):
        return None
    # orig_argv is [interpreter, *its options, script or "-m mod" or "-c code", *argv[1:]]
    head = orig[: len(orig) - len(argv) + 1]
    if orig[len(head) :] != argv[1:] or len(head) < 2 or "-c" in head[1:]:
        return None
    if head[-2:] != ["-m", "django"] and os.path.isfile(head[-1]):
        head[-1] = os.path.abspath(head[-1])  # the child may not start in this directory
    return [sys.executable, *head[1:]]


def consumer_command(
    args: Sequence[str],
    settings_module: str | None = None,
    *,
    entry: Sequence[str] | None = None,
) -> list[str]:
    """The command line of one child: ``entry`` (:func:`entry_point`) or, without one, this
    interpreter with ``-m django``; then ``rmq_consume`` and ``args``. ``--settings`` is added
    only without ``entry`` (an entry point chooses its settings as it did for the parent)."""
    if entry:
        return [*entry, "rmq_consume", *args]
    cmd = [sys.executable, "-m", "django", "rmq_consume", *args]
    if settings_module and not any(a == "--settings" or a.startswith("--settings=") for a in args):
        cmd += ["--settings", settings_module]
    return cmd


def child_environment(*, project_root: bool = True) -> dict[str, str]:
    """The supervisor's environment, plus (``project_root``: for ``python -m django``
    children) the project's root on ``PYTHONPATH``.

    ``manage.py`` puts its own directory on ``sys.path``; ``python -m django`` does not,
    so the directory that holds the settings package is added explicitly.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if not project_root:
        return env
    roots: list[str] = []
    try:
        from django.conf import settings

        module = sys.modules.get(settings.SETTINGS_MODULE.split(".")[0])
        path = getattr(module, "__file__", None)
        if path:
            roots.append(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    except Exception:  # settings not configured: keep the environment as it is
        logger.debug("could not locate the settings package", exc_info=True)
    old = env.get("PYTHONPATH")
    parts = [*dict.fromkeys(roots), *([old] if old else [])]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # no prctl: the child just outlives a killed supervisor
            pass


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Start ``processes`` children running ``command`` and supervise them until they end."""

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        before_start: Callable[[], None] | None = None,
        share: Share | None = None,
    ) -> None:
        """``share``: the supervisor's own place among hosts (``Share(0, 1)`` alone); each
        child gets its place within it (``Share.child``). ``None``: no index is given."""
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.command = list(command)
        self.env = env
        self.cwd = cwd
        self.slots = [Slot(n) for n in range(1, processes + 1)]
        self.before_start = before_start or _close_database_connections
        self.share = share
        self._signals: list[int] = []
        self._forwarded = 0

    # Signals ------------------------------------------------------------------------------
    def install_signal_handlers(
        self, on_signal: Callable[[int, int], None] | None = None
    ) -> Callable[[], None]:
        """Record SIGTERM/SIGINT; the main loop forwards each to the children.
        ``on_signal(signum, count)`` is told too (the command's notice to the operator)."""

        def record(signum: int) -> None:
            self._signals.append(signum)
            if on_signal is not None:
                on_signal(signum, len(self._signals))

        return on_stop_signals(record)

    @property
    def stopping(self) -> bool:
        return bool(self._signals)

    # Children -----------------------------------------------------------------------------
    def _start(self, slot: Slot) -> None:
        self.before_start()
        env = self.env
        if self.share is not None:
            env = dict(os.environ if env is None else env)
            env[SHARE_ENV] = str(self.share.child(slot.number - 1, len(self.slots)))
        slot.proc = subprocess.Popen(self.command, env=env, cwd=self.cwd, preexec_fn=_child_setup)
        slot.started_at = time.monotonic()
        slot.restart_at = None
        logger.info(
            "started consumer process %d/%d (pid %d)", slot.number, len(self.slots), slot.proc.pid
        )

    def _reap(self, slot: Slot) -> None:
        assert slot.proc is not None
        code = slot.proc.returncode
        pid = slot.proc.pid
        lived = time.monotonic() - slot.started_at
        slot.proc = None
        slot.last_code = code
        slot.history.append(code)
        if self.stopping:
            log = logger.info if code == 0 else logger.warning
            log("consumer process %d (pid %d) stopped: %s", slot.number, pid, describe_exit(code))
            slot.finished = True
            return
        if code == 0:
            logger.info(
                "consumer process %d (pid %d) finished (exit code 0); not restarting",
                slot.number,
                pid,
            )
            slot.finished = True
            return
        if lived >= HEALTHY_AFTER:
            slot.backoff.reset()
        wait = slot.backoff.next()
        slot.restart_at = time.monotonic() + wait
        slot.restarts += 1
        logger.error(
            "consumer process %d (pid %d) died after %.1fs (%s); restarting in %.1fs",
            slot.number,
            pid,
            lived,
            describe_exit(code),
            wait,
        )

    def _forward(self, signum: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signum)
        logger.warning(
            "%s: forwarded to %d consumer process(es)%s",
            signal.Signals(signum).name,
            sum(1 for s in self.slots if s.proc is not None),
            " (warm shutdown)" if self._forwarded == 0 else " (cold exit)",
        )
        self._forwarded += 1

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.slots if s.proc is not None]

    def run(self) -> int:
        """Supervise until every child has exited; returns 0 if all exited 0."""
        for slot in self.slots:
            self._start(slot)
        while True:
            while len(self._signals) > self._forwarded:
                self._forward(self._signals[self._forwarded])
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is not None:
                    self._reap(slot)
                if (
                    slot.proc is None
                    and not slot.finished
                    and slot.restart_at is not None
                    and not self.stopping
                    and time.monotonic() >= slot.restart_at
                ):
                    self._start(slot)
                if slot.proc is None and self.stopping and not slot.finished:
                    slot.finished = True  # was waiting for its restart: nothing to stop
                    slot.last_code = None
            if all(s.finished for s in self.slots):
                break
            time.sleep(POLL_INTERVAL)
        failed = [s for s in self.slots if s.last_code not in (0, None)]
        return 0 if not failed else 1


def _close_database_connections() -> None:
    try:
        from django.db import connections

        connections.close_all()
    except Exception:  # Django not set up (plain use of Supervisor): nothing to close
        logger.debug("closing database connections failed", exc_info=True)
