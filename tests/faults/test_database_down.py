"""Scenario 3: PostgreSQL stopped while messages that must be parked are in flight.

Nothing is acked while the database is down, the consumer says so in one line, keeps its
broker connection, and parks everything once the database is back. Stops the machine's
PostgreSQL cluster for a few seconds and always starts it again.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, connections

from tests.conftest import rabbitmqctl_cmd, read_log, wait_for
from tests.faults.conftest import record, spawn, stop
from tests.testapp.events import other

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def pg_cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        capture_output=True,
        timeout=120,
    )


def pg_up() -> bool:
    try:
        connections.close_all()
        with connection.cursor() as cur:
            cur.execute("select 1")
        return True
    except Exception:
        return False


def queue_messages(queue: str) -> int:
    """Ready + unacked messages of a queue, as the broker counts them."""
    out = subprocess.run(
        rabbitmqctl_cmd("list_queues", "-q", "--no-table-headers", "name", "messages"),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == queue:
            return int(parts[1])
    raise AssertionError(f"queue {queue} not listed")


def _declared(rmq, short: str) -> bool:
    name = f"{rmq.prefix}.tests.faults.dbapp.consumers.{short}"
    try:
        rmq.depth(name)
        return True
    except Exception:
        return False


def test_database_down_while_messages_must_be_parked(dbapp, rmq, procs):
    if connection.vendor != "postgresql":
        pytest.skip(
            "scenario 3 stops PostgreSQL; this run's test database is SQLite "
            "(run with DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres)"
        )
    if not Path("/etc/postgresql").is_dir():
        pytest.skip("no local PostgreSQL cluster to stop (pg_ctlcluster)")
    from django_rmq_retry.models import ParkedMessage

    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = rmq.queue("gamma")
    proc = spawn(rmq, "gamma", "--threads", "1")
    procs.append(proc)
    # A second consumer runs a receiver that queries the database (tests.faults.dbapp).
    needs_db = dbapp.needs_db

    db_proc = spawn(
        rmq,
        "tests.faults.dbapp.consumers.uses_db",
        "--threads",
        "2",
        DJANGO_SETTINGS_MODULE="tests.faults.settings",
    )
    procs.append(db_proc)
    other.send({"id": "warm-up"})  # the consumers are connected and working
    assert wait_for(lambda: any(e["event"] == "done" for e in read_log(rmq.log)), 60)
    assert wait_for(lambda: _declared(rmq, "uses_db"), 60)
    needs_db.send({"id": "db-warm-up"})
    assert wait_for(
        lambda: any(e["id"] == "db-warm-up" and e["event"] == "done" for e in read_log(rmq.log)),
        60,
    )
    n_db = 5
    n_park, n_retry, n_ok = 20, 20, 20
    connections.close_all()
    down_at = time.monotonic()
    try:
        pg_cluster("stop")
        for i in range(n_park):
            other.send({"id": f"park-{i}", "reject": True})
        for i in range(n_retry):
            other.send({"id": f"retry-{i}", "fail": 1})
        for i in range(n_ok):
            other.send({"id": f"ok-{i}"})
        for i in range(n_db):
            needs_db.send({"id": f"db-{i}"})
        time.sleep(8)  # the scenario: the consumers meet 8 s of outage (a window, not a wait)
        held = queue_messages(queue)
        alive_while_down = proc.poll() is None
        lines_while_down = proc.output()
    finally:
        pg_cluster("start")
    assert wait_for(pg_up, 60, 0.5), "PostgreSQL did not come back"
    downtime = time.monotonic() - down_at

    def parked() -> int:
        try:
            return ParkedMessage.objects.count()
        except Exception:
            connections.close_all()
            return -1

    assert wait_for(lambda: parked() >= n_park, 90, 0.5), proc.output()[-3000:]
    assert wait_for(
        lambda: (
            len({e["id"] for e in read_log(rmq.log) if e["event"] == "done"}) >= n_retry + n_ok + 1
        ),
        90,
    )
    assert wait_for(
        lambda: (
            {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}
            >= {f"db-{i}" for i in range(n_db)}
        ),
        90,
    ), db_proc.output()[-3000:]
    db_alive = db_proc.poll() is None
    db_out = stop(db_proc)
    out = stop(proc)
    all_done = {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}
    db_done = {i for i in all_done if str(i).startswith("db-")}
    done = all_done - db_done
    rows = list(ParkedMessage.objects.values_list("reason", "body"))
    unavailable = lines_while_down.count("database unavailable")
    record(
        "3 database down (PostgreSQL)",
        published=n_park + n_retry + n_ok + 1 + n_db + 1,
        handled=len(done) + len(db_done),
        parked=len(rows),
        duplicates=len(rows) - n_park,
        lost=n_park + n_retry + n_ok + 1 + n_db + 1 - len(all_done) - len(rows),
        notes=f"down {downtime:.0f}s, {held} held unacked/ready while down, "
        f"{unavailable} 'database unavailable' line(s), DB-using receiver retried "
        f"{db_out.count('retry ')}x",
    )
    assert alive_while_down, lines_while_down[-3000:]
    # Nothing acked while down: every message that needed parking is still on the broker.
    assert held >= n_park, (held, lines_while_down[-3000:])
    assert unavailable == 1, lines_while_down[-3000:]
    assert "database is back" in out, out[-3000:]
    assert {r for r, _b in rows} == {"rejected"}
    assert len(rows) == n_park
    assert done == {f"retry-{i}" for i in range(n_retry)} | {f"ok-{i}" for i in range(n_ok)} | {
        "warm-up"
    }
    assert "Traceback" not in out, out[-3000:]
    # The receiver that needs the database failed into retries, not into a crash loop.
    assert db_alive, db_out[-3000:]
    assert db_done == {f"db-{i}" for i in range(n_db)} | {"db-warm-up"}
    assert db_out.count("retry tests.faults.dbapp.consumers.uses_db") >= n_db, db_out[-3000:]
    assert "0 reconnect(s)" in db_out, db_out[-3000:]
    assert not ParkedMessage.objects.filter(receiver__endswith="uses_db").exists()
