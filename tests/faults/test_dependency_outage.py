"""A dependency down 45 s under three ``rmq_consume`` processes (``depends_on=``).

300 messages to ``charge`` (depends on "payments", which raises ``ConnectionError`` while a
flag file exists) and 100 to ``notify`` (depends on nothing). The breaker trips after
TRIP_FAILURES failures across the processes; while it is open the receiver runs only as
the probe, one per PROBE_AFTER for the whole cluster (not one per process); nothing is
parked; once the flag is gone the probe closes it and all 300 are handled, none lost; and
``notify`` never waits: it is done before the outage ends, never given back. Then the same
with a consumer SIGKILLed while the breaker is open.

The children run ``tests/faults/breaker_settings.py``: TRIP_FAILURES 3 in 10 s, PROBE_AFTER
5 s and PROBE_BACKOFF_MAX 5 s (a probe every 5 s: the bound is the tightest).
"""

from __future__ import annotations

import importlib
import math
import time
from pathlib import Path

import pytest

from django_rmq_retry.models import DependencyEvent, ParkedMessage
from django_rmq_retry.registry import default_registry
from tests.conftest import read_log, wait_for
from tests.faults.conftest import kill, record, spawn, stop

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

CHARGES, NOTIFIES = 300, 100
DOWN_FOR = 45.0
PROBE_AFTER = 5.0
CHILD = {"DJANGO_SETTINGS_MODULE": "tests.faults.breaker_settings"}


@pytest.fixture
def breakerapp(registry_snapshot, rmq, settings):
    """The breaker app's receivers registered here too (the topology, the publishing) and
    the "payments" dependency in this process's settings (to read its row)."""
    from tests.breakerapp import receivers
    from tests.faults import breaker_settings

    for rec in default_registry.all():
        if rec.name.startswith(receivers.__name__ + "."):
            default_registry.unregister(rec.func)
    module = importlib.reload(receivers)
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "DEPENDENCIES": {"payments": breaker_settings.PAYMENTS},
    }
    rmq.setup()
    return module


def events_at(to_state: str, from_state: str | None = None) -> list[float]:
    """When the breaker went to ``to_state`` (from ``from_state``), in epoch seconds."""
    events = DependencyEvent.objects.filter(dependency="payments", to_state=to_state)
    if from_state is not None:
        events = events.filter(from_state=from_state)
    return [e.at.timestamp() for e in events]


def outage(rmq, procs, app, tmp_path: Path, *, sigkill: bool, label: str) -> None:
    flag = tmp_path / "payments-down"
    flag.write_text("down")
    env = {**CHILD, "RMQ_TEST_DOWN_FLAG": str(flag)}
    consumers = [spawn(rmq, "--prefetch", "20", **env) for _ in range(3)]
    procs.extend(consumers)
    down_at = time.time()
    for i in range(CHARGES):
        app.charge_topic.send({"id": i})
    for i in range(NOTIFIES):
        app.notify_topic.send({"id": i})

    assert wait_for(lambda: events_at("open"), timeout=60), "the breaker never tripped"
    killed = 0
    if sigkill:  # one consumer dies while the breaker is open; the others go on
        assert wait_for(lambda: _state() == "open", timeout=30)
        kill(consumers[0])
        killed = 1
    wait_for(lambda: time.time() - down_at >= DOWN_FOR, timeout=DOWN_FOR + 5, interval=0.5)
    flag.unlink()  # the dependency is back
    up_at = time.time()

    def done(name: str) -> set[int]:
        return {
            e["id"] for e in read_log(rmq.log) if e["receiver"] == name and e["event"] == "done"
        }

    settled = wait_for(
        lambda: len(done("charge")) == CHARGES and len(done("notify")) == NOTIFIES,
        timeout=180,
        interval=0.5,
    )
    outputs = [stop(p) for p in consumers[killed:]]
    log = read_log(rmq.log)
    closed = events_at("closed")
    tripped = events_at("open", from_state="closed")
    lost = (CHARGES - len(done("charge"))) + (NOTIFIES - len(done("notify")))
    parked = ParkedMessage.objects.count()
    # The receiver's calls while the breaker was not closed: between the first trip and
    # the close, counted from the children's own log lines.
    first_trip, close = min(tripped), max(closed) if closed else math.inf
    while_open = [
        e
        for e in log
        if e["receiver"] == "charge" and e["event"] == "start" and first_trip < e["t"] < close
    ]
    probes_allowed = math.ceil((close - first_trip) / PROBE_AFTER) + 1
    notify_done = [e["t"] for e in log if e["receiver"] == "notify" and e["event"] == "done"]
    record(
        label,
        published=CHARGES + NOTIFIES,
        handled=len(done("charge")) + len(done("notify")),
        parked=parked,
        duplicates=sum(1 for e in log if e["event"] == "done") - CHARGES - NOTIFIES,
        lost=lost,
        notes=f"down {up_at - down_at:.0f}s, open {close - first_trip:.0f}s, "
        f"{len(while_open)} receiver call(s) while open (at most {probes_allowed} probes "
        f"+ 3 in flight at the trip), {len(tripped)} trip(s), {killed} SIGKILL",
    )
    assert settled, f"not settled: {len(done('charge'))} charges, {len(done('notify'))} notifies"
    assert lost == 0 and parked == 0
    assert closed, "the breaker never closed"
    # One probe per PROBE_AFTER for the whole cluster (per process would be three times
    # that), plus the one call per process that was running as the breaker tripped.
    assert len(while_open) <= probes_allowed + 3, while_open
    assert len(while_open) >= 1  # it did probe
    assert max(notify_done) < up_at  # the independent receiver never waited for it
    notify_runs = [e for e in log if e["receiver"] == "notify" and e["event"] == "start"]
    assert all(e["attempt"] == 1 for e in notify_runs)  # never retried
    if not killed:  # each ran once: never given back (a SIGKILL redelivers what it held)
        assert len(notify_runs) == NOTIFIES
    # The consumers stopped taking from the dependent queue (not only gave back), and
    # took from it again, ramped.
    assert any("not consuming" in out for out in outputs), outputs[0][-3000:]
    assert any("consuming" in out and "again" in out for out in outputs)


def _state() -> str:
    from django_rmq_retry.breakers import state

    return state.read("payments").state.value


def test_a_dependency_down_45s_parks_nothing_and_loses_nothing(rmq, procs, breakerapp, tmp_path):
    outage(rmq, procs, breakerapp, tmp_path, sigkill=False, label="dependency down 45 s")


def test_the_same_with_a_consumer_sigkilled_while_open(rmq, procs, breakerapp, tmp_path):
    outage(
        rmq, procs, breakerapp, tmp_path, sigkill=True, label="dependency down, SIGKILL while open"
    )
