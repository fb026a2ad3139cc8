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

from tests.conftest import read_log, wait_for
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
        ["rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name", "messages"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == queue:
            return int(parts[1])
    raise AssertionError(f"queue {queue} not listed")


def test_database_down_while_messages_must_be_parked(rmq, procs):
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
    other.send({"id": "warm-up"})  # the consumer is connected and working
    assert wait_for(lambda: any(e["event"] == "done" for e in read_log(rmq.log)), 60)
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
        time.sleep(8)
        held = queue_messages(queue)
        alive_while_down = proc.poll() is None
        lines_while_down = "".join(proc._fault_lines)
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

    assert wait_for(lambda: parked() >= n_park, 90, 0.5), "".join(proc._fault_lines)[-3000:]
    assert wait_for(
        lambda: (
            len({e["id"] for e in read_log(rmq.log) if e["event"] == "done"}) >= n_retry + n_ok + 1
        ),
        90,
    )
    out = stop(proc)
    done = {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}
    rows = list(ParkedMessage.objects.values_list("reason", "body"))
    unavailable = lines_while_down.count("database unavailable")
    record(
        "3 database down (PostgreSQL)",
        published=n_park + n_retry + n_ok + 1,
        handled=len(done),
        parked=len(rows),
        duplicates=len(rows) - n_park,
        lost=n_park + n_retry + n_ok + 1 - len(done) - len(rows),
        notes=f"down {downtime:.0f}s, {held} held unacked/ready while down, "
        f"{unavailable} 'database unavailable' line(s)",
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
