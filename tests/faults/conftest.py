"""Fault-injection helpers: exact tallies from the handling log and the parked rows, and the
count table printed at the end of the session (``pytest_terminal_summary``).

Counting rules (every scenario uses them):

* a (receiver, id) pair is *handled* when the receiver logged ``done`` for it;
* it is *parked* when a ``ParkedMessage`` row of that receiver carries that id in its body;
* *duplicates* = extra ``done`` lines of one pair + pairs both handled and parked (both are
  what at-least-once allows after a crash between the work and the ack);
* *lost* = expected pairs that are neither handled nor parked once every queue we own is
  empty. Lost must be 0.

A scenario that kills the consumer process at least ``DELIVERY_LIMIT`` times may see a
message parked with reason *delivery_limit* whatever it was expected to do: its receiver was
running each time the process died, and the consumer cannot tell that from a message that
kills the process (docs/explanation/guarantees.md, "Every give-back is bounded"). Such a
park (:meth:`Tally.parked_by_deaths`) is accounted for, never lost, and counted in the notes;
any other outcome than the expected one is still wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Child, read_log, start_consumer

ROWS: list[dict[str, Any]] = []
COLUMNS = ("scenario", "published", "handled OK", "parked", "duplicates", "lost", "notes")


def record(
    scenario: str,
    *,
    published: int,
    handled: int,
    parked: int,
    duplicates: int,
    lost: int,
    notes: str = "",
) -> None:
    row = {
        "scenario": scenario,
        "published": published,
        "handled OK": handled,
        "parked": parked,
        "duplicates": duplicates,
        "lost": lost,
        "notes": notes,
    }
    ROWS.append(row)
    print("\nCOUNTS " + " | ".join(f"{k}={row[k]}" for k in COLUMNS))


def format_table(rows: Iterable[dict[str, Any]]) -> list[str]:
    rows = list(rows)
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    line = "| " + " | ".join(c.ljust(widths[c]) for c in COLUMNS) + " |"
    sep = "|" + "|".join("-" * (widths[c] + 2) for c in COLUMNS) + "|"
    out = [line, sep]
    for r in rows:
        out.append("| " + " | ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) + " |")
    return out


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("fault-injection count table")
    for line in format_table(ROWS):
        terminalreporter.write_line(line)
    out = os.environ.get("FAULTS_TABLE_FILE")
    if out:
        Path(out).write_text("\n".join(format_table(ROWS)) + "\n")


# Tally ------------------------------------------------------------------------------------
def short(receiver: str) -> str:
    return receiver.rsplit(".", 1)[-1]


def body_id(body: bytes) -> Any:
    try:
        data = json.loads(bytes(body))
    except (ValueError, UnicodeDecodeError):
        return None
    return data.get("id") if isinstance(data, dict) else None


@dataclass
class Tally:
    expected: dict[tuple[str, Any], str]  # (receiver short name, id) -> "done" | "parked"
    done: Counter[tuple[str, Any]] = field(default_factory=Counter)
    parked: dict[tuple[str, Any], Any] = field(default_factory=dict)  # -> ParkedMessage row

    def refresh(self, log: Path) -> Tally:
        from django_rmq_retry.models import ParkedMessage

        self.done = Counter((e["receiver"], e["id"]) for e in read_log(log) if e["event"] == "done")
        self.parked = {}
        for row in ParkedMessage.objects.all().iterator():
            self.parked[(short(row.receiver), body_id(row.body))] = row
        return self

    @property
    def lost(self) -> list[tuple[str, Any]]:
        return [k for k in self.expected if k not in self.done and k not in self.parked]

    @property
    def handled_ok(self) -> int:
        return sum(1 for k in self.expected if k in self.done)

    @property
    def parked_count(self) -> int:
        return sum(1 for k in self.expected if k in self.parked)

    @property
    def duplicates(self) -> int:
        extra = sum(n - 1 for n in self.done.values() if n > 1)
        both = sum(1 for k in self.parked if k in self.done)
        return extra + both

    def complete(self) -> bool:
        return not self.lost

    def parked_by_deaths(self, deaths: int) -> set[tuple[str, Any]]:
        """Expected pairs parked by the delivery limit because the process kept dying under
        their receiver: possible only after ``DELIVERY_LIMIT`` deaths, and the row must say
        that the consumer died (no cause this process saw: a refused copy, a lost channel)."""
        from django_rmq_retry.conf import app_settings
        from django_rmq_retry.core.budget import UNSEEN_CAUSE

        if deaths < int(app_settings.DELIVERY_LIMIT):
            return set()
        return {
            k
            for k, row in self.parked.items()
            if k in self.expected
            and k not in self.done
            and row.reason == "delivery_limit"
            and UNSEEN_CAUSE in row.reason_detail
        }

    def wrong_outcome(self, deaths: int = 0) -> list[str]:
        """Pairs that ended the wrong way (handled but should park, or the reverse);
        ``deaths``: SIGKILLs of the consumer in the scenario (see :meth:`parked_by_deaths`)."""
        bad = []
        allowed = self.parked_by_deaths(deaths)
        for k, want in self.expected.items():
            if k in allowed:
                continue
            if want == "done" and k not in self.done:
                bad.append(f"{k} expected done, got {'parked' if k in self.parked else 'nothing'}")
            if want == "parked" and k not in self.parked:
                bad.append(f"{k} expected parked, got {'done' if k in self.done else 'nothing'}")
        return bad


# Processes --------------------------------------------------------------------------------
def spawn(rmq: Any, *args: str, **env: str) -> Child:
    """``start_consumer``: the child writes to a file, so a chatty one never blocks."""
    return start_consumer(rmq.prefix, rmq.log, *args, **env)


def output(proc: Child) -> str:
    return proc.output()


def _reap(proc: Child, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def kill(proc: Child, sig: int = signal.SIGKILL) -> str:
    """Signal one child we started (by its pid), reap it, return its output."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    return _reap(proc, 60)


def stop(proc: Child, timeout: float = 60) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return _reap(proc, timeout)


@pytest.fixture
def procs() -> Iterator[list[Child]]:
    """Children started by a test; any still running at teardown are killed (by pid)."""
    started: list[Child] = []
    yield started
    for p in started:
        if p.poll() is None:
            kill(p)


def undeclare(rmq: Any) -> None:
    """Delete this test's queues (the ``rmq`` fixture declared them with the suite's queue
    type), so that a test of another queue type can declare them again as its own."""
    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.registry import default_registry

    for q in current_plan(default_registry.all(), rmq.names).queues:
        with contextlib.suppress(Exception):
            rmq.ch().queue_delete(q.name)


def queues_empty(rmq: Any) -> bool:
    """Every receiver, delay and orphan queue of this test's prefix is empty."""
    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.registry import default_registry

    plan = current_plan(default_registry.all(), rmq.names)
    for q in plan.queues:
        try:
            if rmq.depth(q.name):
                return False
        except Exception:
            return False
    return True


def depths(rmq: Any) -> dict[str, int]:
    """Ready messages per non-empty queue of this test's prefix (for failure messages)."""
    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.registry import default_registry

    out = {}
    for q in current_plan(default_registry.all(), rmq.names).queues:
        try:
            n = rmq.depth(q.name)
        except Exception as exc:
            out[q.name] = repr(exc)
            continue
        if n:
            out[q.name] = n
    return out


def settle(rmq: Any, tally: Tally, timeout: float) -> bool:
    """Wait until every expected pair is accounted for and every queue is empty."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tally.refresh(rmq.log).complete() and queues_empty(rmq):
            return True
        time.sleep(0.5)
    return tally.refresh(rmq.log).complete() and queues_empty(rmq)
