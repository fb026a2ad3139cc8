"""The ``tasks`` scenario: Django tasks end to end on our backend and on the backends a Django
team would pick instead, on the same machine in the same run.

Backends (each on a PostgreSQL database of its own, ``<prefix>_<system>``, made, migrated and
dropped here; settings ``bench/tasks_settings.py``; tasks ``bench/tasksapp/tasks.py``):

* ``ours``: ``RabbitMQBackend``, workers ``manage.py rmq_consume`` (``--processes 4``), on this
  venv (Django 5.2 + the ``django-tasks`` backport), beside ``db``: django-tasks-db's
  ``db_worker`` (4 processes for 4 workers).
* ``ours6``: ours again in ``bench/.venv-tasks`` (Django 6, Python 3.12+, made by
  ``bench/tasks_venv.sh``), beside what needs that venv: ``ox``, django-ox's ``ox_worker
  --processes 4``, and ``celery``, django-tasks-celery with a Celery worker (prefork pool,
  concurrency 4) on our RabbitMQ. Each peer's ratio is to the ours of its own venv.

A row: N tasks enqueued through the task API with no worker running (the enqueue rate goes
in the note), then a waiter (``bench/tasks_side.py wait``, the enqueuer's side) starts
counting SUCCESSFUL results every 20 ms, the workers start, and when all N are there the
waiter reads each back with ``get_result``. Each worker process marks its first task; the
rate is taken from the moment the last worker started (all W running: start-up and uneven
starts left out) to the poll that saw the last SUCCESSFUL result: (N − done by then) / time.
Rows: a no-op task with 1 and with 4 workers; a task failing its first attempt, retried
after 1 s, with 4 workers, where the backend can retry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import PG_ADMIN_URL, ROOT, Row, Run

PEER_PYTHON = ROOT / "bench" / ".venv-tasks" / "bin" / "python"
SIDE = str(ROOT / "bench" / "tasks_side.py")
DONE_TIMEOUT = 900.0


@dataclass(frozen=True)
class System:
    key: str  # database suffix
    backend: str  # BENCH_TASKS_BACKEND
    python: str
    label: str
    venv: str = ""  # Django and Python of its venv


@dataclass(frozen=True)
class Case:
    name: str
    task: str
    workers: int
    n: int


@dataclass
class Measured:
    rate: float  # tasks/s, every worker running
    enqueue_rate: float
    counted: int  # tasks inside the timed window
    workers_seen: int


NO_RETRY = {
    "db": "n/a: django-tasks-db has no retries (a failed task is FAILED)",
    "celery": "n/a: the bridge registers each task with no Celery retry options, and the "
    "task API has none to give it",
}


def versions(python: str) -> dict[str, str]:
    code = (
        "import json, sys, importlib.metadata as m\n"
        "out = {'python': sys.version.split()[0]}\n"
        "for d in ('django', 'django-tasks', 'django-tasks-db', 'django-ox',"
        " 'django-tasks-celery', 'celery'):\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    got = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(got.stdout)


def systems() -> tuple[list[System], list[str]]:
    """The systems this machine can run, and why any are left out."""
    main = versions(sys.executable)
    out = []
    missing = []
    here = f"Django {main['django']}"
    if "django-tasks" in main:
        here += f" + django-tasks {main['django-tasks']}"
    here += f", Python {main['python']}"
    out.append(System("ours", "ours", sys.executable, "ours", here))
    if "django-tasks-db" in main:
        db = f"django-tasks-db {main['django-tasks-db']}"
        out.append(System("db", "db", sys.executable, db, here))
    else:
        missing.append("django-tasks-db: .venv/bin/pip install --group peers")
    if PEER_PYTHON.exists():
        peer = versions(str(PEER_PYTHON))
        there = f"Django {peer['django']}, Python {peer['python']}"
        py = str(PEER_PYTHON)
        out.append(System("ours6", "ours", py, "ours", there))
        out.append(System("ox", "ox", py, f"django-ox {peer['django-ox']}", there))
        bridge = f"django-tasks-celery {peer['django-tasks-celery']} + Celery {peer['celery']}"
        out.append(System("celery", "celery", py, bridge, there))
    else:
        missing.append("django-ox, django-tasks-celery: bash bench/tasks_venv.sh")
    return out, missing


class Tasks:
    """One run of the scenario: its databases, queues and worker processes."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.databases: list[str] = []
        self.celery_queue = f"{run.prefix}.tasks.celery"

    def env(self, system: System, **extra: str) -> dict[str, str]:
        base = PG_ADMIN_URL.rsplit("/", 1)[0]
        return self.run.env(
            "sqlite",
            DJANGO_SETTINGS_MODULE="bench.tasks_settings",
            BENCH_TASKS_BACKEND=system.backend,
            DATABASE_URL=f"{base}/{self.run.prefix}_{system.key}",
            **extra,
        )

    def prepare(self, system: System) -> None:
        import psycopg

        name = f"{self.run.prefix}_{system.key}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        subprocess.run(
            [system.python, "-m", "django", "migrate", "-v0"],
            cwd=ROOT,
            env=self.env(system),
            check=True,
        )
        if system.backend == "celery":
            self.run.extra_queues.add(self.celery_queue)

    def workers(self, system: System, count: int, mark: Path) -> list[subprocess.Popen[bytes]]:
        py = [system.python, "-m"]
        many = [] if count == 1 else ["--processes", str(count)]
        cmds = {
            "ours": [[*py, "django", "rmq_consume", "--no-orphans", "--no-relay", *many]],
            "db": [[*py, "django", "db_worker", "--no-startup-delay"]] * count,
            "ox": [[*py, "django", "ox_worker", *many]],
            "celery": [
                [*py, "celery", "-A", "bench.tasksapp.celery_app", "worker", "--pool",
                 "prefork", "--concurrency", str(count), "--without-gossip",
                 "--without-mingle", "--without-heartbeat", "--loglevel", "warning"]
            ],
        }[system.backend]  # fmt: skip
        env = self.env(system, BENCH_TASKS_MARK=str(mark))
        procs = []
        for i, cmd in enumerate(cmds):
            log = open(self.run.path(f"{system.key}-worker{i}.log"), "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )  # fmt: skip
            log.close()
        return procs

    def measure(self, system: System, case: Case) -> Measured:
        ids, mark, polls = (self.run.path(s) for s in ("ids.json", "mark", "polls.json"))
        mark.touch()
        env = self.env(system)
        got = subprocess.run(
            [system.python, SIDE, "enqueue", case.task, str(case.n), str(ids)],
            cwd=ROOT, env=env, capture_output=True, text=True,
        )  # fmt: skip
        if got.returncode:
            raise RuntimeError(f"{system.key}: enqueue failed:\n{got.stderr[-3000:]}")
        enq = json.loads(got.stdout.splitlines()[-1])
        self.run.extra_queues.update(enq["queues"])
        waiter = subprocess.Popen(
            [system.python, SIDE, "wait", str(case.n), str(ids), str(polls), str(DONE_TIMEOUT)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert waiter.stdout is not None
        if waiter.stdout.readline().strip() != "ready":
            waiter.kill()
            raise RuntimeError(f"{system.key}: the waiter did not start: {waiter.stderr}")
        procs = self.workers(system, case.workers, mark)
        try:
            out, err = waiter.communicate(timeout=DONE_TIMEOUT + 120)
        finally:
            stop(procs)
        if waiter.returncode:
            raise RuntimeError(f"{system.key} {case.name}: {err[-3000:]}")
        checked = json.loads(out.splitlines()[-1])["checked"]
        if checked != case.n:
            raise RuntimeError(f"{system.key} {case.name}: {checked} results read back")
        return window(case, json.loads(polls.read_text()), mark, enq["seconds"])

    def cleanup(self) -> None:
        import pika
        import psycopg

        from bench.common import BROKER_URL

        try:
            conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
            try:
                conn.channel().exchange_delete(self.celery_queue)
            finally:
                conn.close()
        finally:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as pg:
                for name in self.databases:
                    pg.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each worker's process group (a warm shutdown), SIGKILL what is left after 30 s."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def window(case: Case, polls: list[list[float]], mark: Path, enqueue_s: float) -> Measured:
    """The rate from the last worker's first task to the poll that saw the N-th result."""
    firsts: dict[str, float] = {}
    for line in mark.read_text().split("\n"):
        if line.strip():
            t, pid = line.split()
            firsts[pid] = min(float(t), firsts.get(pid, float(t)))
    if not firsts:
        raise RuntimeError(f"{case.name}: no worker marked a task")
    all_running = max(firsts.values())
    before = [p for p in polls if p[0] <= all_running] or polls[:1]
    t0, done0 = before[-1]
    t_end = next(t for t, c in polls if c >= case.n)
    return Measured(
        rate=(case.n - done0) / (t_end - t0),
        enqueue_rate=case.n / enqueue_s,
        counted=int(case.n - done0),
        workers_seen=len(firsts),
    )


def cases(run: Run) -> list[Case]:
    n1, n4, nr = (500, 1_000, 500) if run.quick else (2_000, 4_000, 2_000)
    return [
        Case("1 worker", "noop", 1, n1),
        Case("4 workers", "noop", 4, n4),
        Case("retry once after 1 s, 4 workers", "fail_once", 4, nr),
    ]


PAIRS = [("ours", "db"), ("ours6", "ox"), ("ours6", "celery")]


def rows_of(got: dict[tuple[str, str], Measured], by_key: dict[str, System], run: Run) -> list[Row]:
    rows = []
    for case in cases(run):
        for ours, peer in PAIRS:
            if ours not in by_key or peer not in by_key:
                continue
            mine = got.get((ours, case.name))
            theirs = got.get((peer, case.name))
            label = f"tasks {case.name}, {case.n:,}: ours vs {by_key[peer].label}"
            note = f"{by_key[peer].venv}; enqueue " + ", ".join(
                f"{by_key[k].label} {m.enqueue_rate:,.0f}/s"
                for k, m in ((ours, mine), (peer, theirs))
                if m is not None
            )
            if case.task == "fail_once" and peer in NO_RETRY:
                rows.append(Row(label, mine.rate if mine else None, None, "tasks/s",
                                note=f"{NO_RETRY[peer]}; {note}"))  # fmt: skip
                continue
            times = 10.0 if (peer == "db" and case.workers == 4) else 1.0
            ratio = mine.rate / theirs.rate if mine and theirs else None
            rows.append(
                Row(
                    label,
                    mine.rate if mine else None,
                    theirs.rate if theirs else None,
                    "tasks/s",
                    f"ours ≥ {times:g}× it",
                    None if ratio is None else ratio >= times,
                    note=note,
                )
            )
    return rows


def tasks(run: Run) -> list[Row]:
    found, missing = systems()
    by_key = {s.key: s for s in found}
    scenario = Tasks(run)
    got: dict[tuple[str, str], Measured] = {}
    try:
        for system in found:
            scenario.prepare(system)
        for case in cases(run):
            for system in found:
                if case.task == "fail_once" and system.key in NO_RETRY:
                    continue
                m = scenario.measure(system, case)
                got[(system.key, case.name)] = m
                print(
                    f"    tasks {case.name}: {system.label} ({system.venv}): {m.rate:,.0f} "
                    f"tasks/s (enqueue {m.enqueue_rate:,.0f}/s, {m.counted:,} timed over "
                    f"{m.workers_seen} worker process(es))",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        scenario.cleanup()
    rows = rows_of(got, by_key, run)
    rows += [Row(f"tasks: skipped {m}", None) for m in missing]
    return rows
