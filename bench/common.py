"""Shared machinery of the benchmarks: one run = one prefix, one work directory, one cleanup.

A run owns everything it creates: broker objects named ``<prefix>.*``, a SQLite file and
(when PostgreSQL is used) a database ``<prefix>`` — all deleted by :meth:`Run.cleanup`.
Consumers run as real ``manage.py rmq_consume`` processes; their raw-pika twins run as
processes too (``bench/raw.py``), and both are timed the same way: from the first
delivery (a line the receiver writes on its first call) to the process's exit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BROKER_URL = os.environ.get("RMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@dataclass
class Row:
    """One line of the result table."""

    figure: str
    ours: float | None
    raw: float | None = None
    unit: str = ""
    target: str = ""
    met: bool | None = None
    ratio: float | None = None  # computed from ours/raw unless given
    note: str = ""

    def ratio_value(self) -> float | None:
        if self.ratio is not None:
            return self.ratio
        if self.ours is not None and self.raw:
            return self.ours / self.raw
        return None


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank): every benchmark's p50 and p99."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def table(rows: list[Row]) -> str:
    head = ["figure", "ours", "raw pika", "ratio", "target", "met?"]
    body = []
    for r in rows:
        ratio = r.ratio_value()
        met = "—" if r.met is None else ("yes" if r.met else "NO")
        body.append(
            [
                r.figure + (f" ({r.note})" if r.note else ""),
                fmt(r.ours, r.unit),
                fmt(r.raw, r.unit),
                "—" if ratio is None or ratio != ratio else f"{ratio:.2f}×",
                r.target or "—",
                met,
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for cells in body:
        lines.append(
            "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rabbit = "?"
    try:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        props = conn._impl.server_properties or {}
        rabbit = props.get("version", b"?")
        rabbit = rabbit.decode() if isinstance(rabbit, bytes) else str(rabbit)
        conn.close()
    except Exception:
        pass
    import django
    import pika

    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPU(s) "
        f"({cpu}); RabbitMQ {rabbit}; Python {sys.version.split()[0]}; pika {pika.__version__}; "
        f"Django {django.__version__}"
    )


class Run:
    """Prefix, work directory, database URLs and the cleanup of one benchmark run."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.prefix = f"bench{uuid.uuid4().hex[:8]}"
        self.workdir = Path(f"/tmp/rmq_{self.prefix}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sqlite_url = f"sqlite:///{self.workdir / 'bench.sqlite3'}"
        self.pg_db: str | None = None
        self.extra_queues: set[str] = set()
        self.cache: dict[Any, Any] = {}
        self._counter = 0

    # Environment -------------------------------------------------------------------------
    def env(self, db: str = "sqlite", **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="bench.settings",
            RMQ_PREFIX=self.prefix,
            RMQ_URL=BROKER_URL,
            DATABASE_URL=self.db_url(db),
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def db_url(self, db: str) -> str:
        if db == "sqlite":
            return self.sqlite_url
        if self.pg_db is None:
            self._create_pg()
        base = PG_ADMIN_URL.rsplit("/", 1)[0]
        return f"{base}/{self.pg_db}"

    def _create_pg(self) -> None:
        import psycopg

        name = self.prefix
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.pg_db = name
        self.migrate("postgres")

    def migrate(self, db: str) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0", "--settings", "bench.settings"],
            cwd=ROOT,
            env=self.env(db),
            check=True,
        )

    def path(self, stem: str) -> Path:
        self._counter += 1
        return self.workdir / f"{self._counter:03d}-{stem}"

    def wait_for_broker_and_reset(self, timeout: float = 180) -> bool:
        """After a failure: wait until the broker answers, then purge this run's queues.

        Returns False if the broker stays unreachable. (Any failed scenario is retried at
        most twice; each attempt prints its traceback, so nothing is hidden.)
        """
        import pika

        from django_rmq_retry.broker.topology import declare
        from django_rmq_retry.conf import current_plan
        from django_rmq_retry.core.names import Names
        from django_rmq_retry.publishing.per_thread import reset_publisher
        from django_rmq_retry.registry import default_registry

        reset_publisher()
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
                break
            except Exception:
                if time.monotonic() > deadline:
                    return False
                time.sleep(2)
        plan = current_plan(default_registry.all(), Names(self.prefix))
        ch = conn.channel()
        declare(ch, plan)
        for name in [q.name for q in plan.queues] + sorted(self.extra_queues):
            try:
                ch.queue_purge(name)
            except Exception:
                ch = conn.channel()
        conn.close()
        self.cache.clear()
        return True

    # Cleanup -----------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Delete this run's queues, exchanges, database and files (whatever got created)."""
        try:
            self._cleanup_broker()
        finally:
            self._cleanup_databases()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _cleanup_broker(self) -> None:
        import pika
        import pika.exceptions
        from django.apps import apps

        if not apps.ready:
            return
        from django_rmq_retry.conf import current_plan
        from django_rmq_retry.publishing.per_thread import reset_publisher

        reset_publisher()
        from django_rmq_retry.core.names import Names
        from django_rmq_retry.registry import default_registry

        plan = current_plan(default_registry.all(), Names(self.prefix))
        queues = [q.name for q in plan.queues] + sorted(self.extra_queues)
        deadline = time.monotonic() + 120  # the broker may be restarting (shared machine)
        while True:
            try:
                conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
                break
            except pika.exceptions.AMQPConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        ch = conn.channel()
        for name in queues:
            try:
                ch.queue_delete(name)
            except Exception:
                ch = conn.channel()
        for name, _kind, _args in plan.exchanges:
            try:
                ch.exchange_delete(name)
            except Exception:
                ch = conn.channel()
        conn.close()

    def _cleanup_databases(self) -> None:
        if self.pg_db:
            import psycopg
            from django.db import connections

            connections.close_all()
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as pg:
                pg.execute(f'DROP DATABASE IF EXISTS "{self.pg_db}" WITH (FORCE)')


@dataclass
class Timed:
    seconds: float  # first delivery → exit
    wall: float  # process start → exit
    maxrss_mb: float  # peak RSS of the process itself (VmHWM, sampled every 50 ms)
    returncode: int
    log: Path
    calls: int = 0  # receiver calls counted by the consumer(s), when they report it


def run_timed(cmd: list[str], env: dict[str, str], mark: Path, log: Path, timeout: float) -> Timed:
    """Run ``cmd``; time it from the first line written to ``mark`` to its exit."""
    start = time.time()
    hwm = 0.0
    next_probe = 0.0
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, _usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                end = time.time()
                break
            if time.monotonic() >= next_probe:
                hwm = max(hwm, vm_hwm_mb(proc.pid))
                next_probe = time.monotonic() + 0.05
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                raise RuntimeError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}; log {log}")
            time.sleep(0.002)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    lines = [line.split() for line in mark.read_text().splitlines() if line.strip()]
    firsts = [float(p[0]) for p in lines if p[0] != "end"]
    ends = [float(p[1]) for p in lines if p[0] == "end"]
    calls = sum(int(p[3]) for p in lines if p[0] == "end")
    if not firsts:
        raise RuntimeError(f"no delivery was marked by {' '.join(cmd)}; log {log}")
    if ends:  # first call → last call (see bench/benchapp/consumers.py)
        end = max(ends)
    return Timed(end - min(firsts), end - start, hwm, proc.returncode, log, calls)


def vm_hwm_mb(pid: int | str = "self") -> float:
    """Peak RSS of one process (``VmHWM``; reset by exec, unlike ``ru_maxrss``, which a
    child inherits from the process that forked it)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def manage_cmd(*args: str) -> list[str]:
    return [sys.executable, "manage.py", *args, "--settings", "bench.settings"]


def raw_cmd(*args: Any) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "raw.py"), *(str(a) for a in args)]


def setup_django(run: Run) -> None:
    """Configure Django in this process for ``run`` (call once, before any Django import)."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="bench.settings",
        RMQ_PREFIX=run.prefix,
        RMQ_URL=BROKER_URL,
        DATABASE_URL=run.sqlite_url,
    )
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    run.migrate("sqlite")
    from django_rmq_retry.broker import connect
    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.registry import default_registry

    conn = connect()
    conn.channel().declare(current_plan(default_registry.all()))
    conn.close()


def queue_name(short: str) -> str:
    from django_rmq_retry.conf import app_settings
    from django_rmq_retry.registry import default_registry

    rec = default_registry.find(short, app_settings.PREFIX)
    assert rec is not None, short
    return rec.queue_name(app_settings.PREFIX)


def declare_raw_queue(run: Run, name: str, routing_key: str | None = None, **args: Any) -> str:
    """A plain durable queue for a raw twin (bound to the work exchange if a key is given)."""
    import pika

    from django_rmq_retry.core.names import Names

    full = f"{run.prefix}.raw.{name}"
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    ch = conn.channel()
    ch.queue_declare(full, durable=True, arguments=args or None)
    if routing_key:
        ch.queue_bind(full, Names(run.prefix).work_exchange, routing_key=routing_key)
    conn.close()
    run.extra_queues.add(full)
    return full


def depth(queue: str) -> int:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    n = conn.channel().queue_declare(queue, passive=True).method.message_count
    conn.close()
    return n


def purge(*queues: str) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    ch = conn.channel()
    for q in queues:
        ch.queue_purge(q)
    conn.close()


def publish_bodies(routing_key: str, n: int, start: int = 0, **extra: Any) -> None:
    """Pre-publish ``n`` small persistent JSON messages with our (confirmed) batch path."""
    from django_rmq_retry.publishing.per_thread import get_publisher

    publisher = get_publisher()
    chunk = 10_000
    for base in range(start, start + n, chunk):
        stop = min(base + chunk, start + n)
        publisher.send_bodies(
            routing_key, [{"i": i, "op": "bench", **extra} for i in range(base, stop)]
        )


def wait_depth(queue: str, expected: int, timeout: float = 60.0) -> None:
    """Wait until ``queue`` holds ``expected`` ready messages (publishes are confirmed, but a
    passive declare may lag a moment behind)."""
    deadline = time.monotonic() + timeout
    while depth(queue) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{queue} has {depth(queue)} messages, expected {expected}")
        time.sleep(0.05)


def dump(obj: Any) -> str:
    return json.dumps(obj, default=str)
