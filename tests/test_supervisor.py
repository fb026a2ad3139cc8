"""``rmq_consume --processes N``: the supervisor against the real broker, in real processes."""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.conftest import ROOT, Child, read_log, start_consumer, subprocess_env, wait_for
from tests.testapp.events import other
from tests.waiting import consuming, until

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
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "--processes", "2", "--prefetch", "5")
    try:
        # Both children consume before the first message: the broker shares the messages
        # between them, however long one of them took to start.
        consuming(rmq, rmq.queue("gamma"), 2, child=proc)
        other.send_many([{"id": i, "sleep": 0.01} for i in range(total)])
        until("every message handled", lambda: len(done_events(rmq.log)) >= total, child=proc)
    finally:
        proc.send_signal(signal.SIGTERM)
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
        until("two children", lambda: len(children_of(proc.pid)) == 2, child=proc)
        first = children_of(proc.pid)
        os.kill(first[0], signal.SIGKILL)
        snapshot: list[list[int]] = [[]]

        def replaced() -> bool:
            # Judge and keep ONE reading of the process table: two separate readings raced
            # with the supervisor reaping the killed child (a flaky unpack under load).
            snapshot[0] = children_of(proc.pid)
            return len(snapshot[0]) == 2 and first[0] not in snapshot[0]

        assert wait_for(replaced, 120), snapshot[0]  # after the supervisor's restart backoff
        now = snapshot[0]
        assert first[1] in now  # the other child was left alone
        (replacement,) = set(now) - set(first)
        # The replacement consumes: work is shared by the survivor and the new child.
        consuming(rmq, rmq.queue("gamma"), 2, child=proc)
        other.send_many([{"id": i, "sleep": 0.02} for i in range(100)])
        until("100 messages handled", lambda: len(done_events(rmq.log)) == 100, child=proc)
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
    # 0.5 s each, one at a time per child: the SIGTERM lands about 13 s before the last
    # message could be done, however late the test gets to send it.
    other.send_many([{"id": i, "sleep": 0.5} for i in range(total)])
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "--processes", "2", "--prefetch", "4")
    until("six messages handled", lambda: len(done_events(rmq.log)) >= 6, child=proc)
    kids = children_of(proc.pid)
    assert len(kids) == 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "forwarded to 2 consumer process(es) (warm shutdown)" in out
    assert "SIGTERM: asked the 2 consumer processes to stop warm" in out  # the command's notice
    assert "Starting 2 consumer processes (each says what it consumes)" in out
    done = {e["id"] for e in done_events(rmq.log)}
    started = {e["id"] for e in read_log(rmq.log) if e["event"] == "start"}
    assert started == done  # every receiver that started finished: warm
    assert 0 < len(done) < total
    assert all(not Path(f"/proc/{pid}").exists() or children_of(pid) == [] for pid in kids)
    # The rest is back, unacked, once the broker has seen the children's connections close.
    back = total - len(done)
    depth = [-1]

    def requeued() -> bool:
        depth[0] = rmq.depth(rmq.queue("gamma"))
        return depth[0] == back

    assert wait_for(requeued, 60), (depth[0], back)


def test_processes_must_be_positive(rmq):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="at least 1"):
        call_command("rmq_consume", "gamma", processes=0, verbosity=0)


# The children's entry point -------------------------------------------------------------------
def test_entry_point_is_how_the_parent_was_started(monkeypatch):
    from django_rmq_retry.management.supervisor import entry_point

    exe = sys.executable
    argv = ["manage.py", "rmq_consume", "--processes", "2"]
    orig = ["python3", "-X", "utf8", "manage.py", "rmq_consume", "--processes", "2"]
    script = str(ROOT / "manage.py")
    monkeypatch.chdir(ROOT)
    assert entry_point(argv, orig) == [exe, "-X", "utf8", script]  # absolute: any cwd
    mod = ["/x/django/__main__.py", "rmq_consume"]
    assert entry_point(mod, ["python", "-m", "django", "rmq_consume"]) == [exe, "-m", "django"]
    # Not started as `... rmq_consume`: call_command in a test, `python -c`: no entry point.
    assert (
        entry_point(["/venv/bin/pytest", "-k", "x"], ["python", "/venv/bin/pytest", "-k", "x"])
        is None
    )
    assert entry_point(["-c", "rmq_consume"], ["python", "-c", "code", "rmq_consume"]) is None


def test_children_start_through_the_projects_manage_py(rmq, tmp_path):
    """A child runs what the parent's manage.py runs before Django, with the parent's
    interpreter options: three lines (supervisor + 2 children), each with utf8=1. With
    ``python -m django`` children the file had one line."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    entry_log = tmp_path / "entry.log"
    manage = ROOT / "tests" / "supervised" / "manage.py"
    env = subprocess_env(rmq.prefix, rmq.log, RMQ_TEST_ENTRY_LOG=str(entry_log))
    env.pop("PYTHONPATH")  # the manage.py puts the project on sys.path, as projects' do
    proc = Child(
        [
            sys.executable,
            "-X",
            "utf8",
            str(manage),
            "rmq_consume",
            "gamma",
            "--processes",
            "2",
            "--max-idle-time",
            "1",
        ],
        env,
        tmp_path / "supervisor.out",
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    lines = entry_log.read_text().splitlines()
    assert len(lines) == 3, (lines, out)
    assert {line.split()[0] for line in lines} >= {str(proc.pid)}
    assert all(line.endswith("utf8=1") for line in lines), lines
