"""``rmq_consume --processes N``: the supervisor against the real broker, in real processes."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.conftest import read_log, start_consumer, wait_for
from tests.testapp.events import other

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def children_of(pid: int) -> list[int]:
    """Live child pids of ``pid`` (from /proc; zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == pid and state != "Z":
            found.append(int(entry.name))
    return sorted(found)


def done_events(log: Path) -> list[dict]:
    return [e for e in read_log(log) if e["event"] == "done"]


def test_two_processes_handle_every_message_exactly_once(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    total = 200
    other.send_many([{"id": i, "sleep": 0.01} for i in range(total)])
    proc = start_consumer(
        rmq.prefix, rmq.log, "gamma", "--processes", "2", "--prefetch", "5", "--max-idle-time", "3"
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "all 2 consumer processes exited" in out
    done = done_events(rmq.log)
    assert Counter(e["id"] for e in done) == Counter(range(total))  # each once, none missing
    pids = Counter(e["pid"] for e in done)
    assert len(pids) == 2, pids  # both processes did work
    assert proc.pid not in pids  # the supervisor itself consumes nothing
    assert rmq.depth(rmq.queue("gamma")) == 0


def test_a_killed_child_is_restarted_and_the_work_goes_on(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "--processes", "2")
    try:
        assert wait_for(lambda: len(children_of(proc.pid)) == 2, 30), children_of(proc.pid)
        first = children_of(proc.pid)
        os.kill(first[0], signal.SIGKILL)
        snapshot: list[list[int]] = [[]]

        def replaced() -> bool:
            # Judge and keep ONE reading of the process table: two separate readings raced
            # with the supervisor reaping the killed child (a flaky unpack under load).
            snapshot[0] = children_of(proc.pid)
            return len(snapshot[0]) == 2 and first[0] not in snapshot[0]

        assert wait_for(replaced, 30), snapshot[0]
        now = snapshot[0]
        assert first[1] in now  # the other child was left alone
        (replacement,) = set(now) - set(first)
        # The replacement consumes: work is shared by the survivor and the new child.
        other.send_many([{"id": i, "sleep": 0.02} for i in range(100)])
        assert wait_for(lambda: len(done_events(rmq.log)) == 100, 60)
        assert {e["pid"] for e in done_events(rmq.log)} == {first[1], replacement}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "(killed by SIGKILL); restarting in" in out
    assert Counter(e["id"] for e in done_events(rmq.log)) == Counter(range(100))


def test_sigterm_to_the_supervisor_is_a_warm_exit(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    total = 60
    other.send_many([{"id": i, "sleep": 0.1} for i in range(total)])
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "--processes", "2", "--prefetch", "4")
    assert wait_for(lambda: len(done_events(rmq.log)) >= 6, 60)
    kids = children_of(proc.pid)
    assert len(kids) == 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "forwarded to 2 consumer process(es) (warm shutdown)" in out
    done = {e["id"] for e in done_events(rmq.log)}
    started = {e["id"] for e in read_log(rmq.log) if e["event"] == "start"}
    assert started == done  # every receiver that started finished: warm
    assert 0 < len(done) < total
    assert all(not Path(f"/proc/{pid}").exists() or children_of(pid) == [] for pid in kids)
    time.sleep(0.5)
    assert rmq.depth(rmq.queue("gamma")) == total - len(done)  # the rest is back, unacked


def test_processes_must_be_positive(rmq):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="at least 1"):
        call_command("rmq_consume", "gamma", processes=0, verbosity=0)
