"""Ordered partitions spread over ``rmq_consume --processes 2`` (``core.spread``).

Each partition queue has a single active consumer, the first to subscribe, and RabbitMQ
never rebalances: if every process subscribed to every partition at once, the first one up
would apply every key and the other would only stand by. With an index (``--processes``
gives child ``i`` of ``N`` the index ``i/N``), a process subscribes first to its partitions
(``p % N == i``) and to the others as a standby. Here, with 4 partitions: each child applies
the keys of two partitions (``p % 2`` apart), both stand by on the rest, and once one is
SIGKILLed the other applies every partition, per key in publish order.

Who applied a message is the ``pid`` of the test receiver's log line (tests/orderapp).
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_rmq_retry.conf import ordering_partitions
from django_rmq_retry.consumer.dependency_consumers import DependencyConsumers
from django_rmq_retry.consumer.standby import StandbyConsumers
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.ordering import partition_of
from django_rmq_retry.core.spread import ENV, STANDBY_GRACE, Share, split
from django_rmq_retry.management.supervisor import Supervisor
from django_rmq_retry.registry import default_registry
from tests.conftest import Child, rabbitmqctl_cmd, read_log, start_consumer, wait_for

KEYS = [f"acct-{i:03d}" for i in range(40)]
CHILD = {"DJANGO_SETTINGS_MODULE": "tests.faults.ordering_settings"}


# The rule, without a broker --------------------------------------------------------------
def test_a_share_takes_every_nth_partition_first() -> None:
    queues = ["plain", "q.p00", "q.p01", "q.p02", "q.p03", "parked"]
    parts = {"q.p00": 0, "q.p01": 1, "q.p02": 2, "q.p03": 3}
    assert split(queues, parts, Share(1, 2)) == (
        ["plain", "q.p01", "q.p03", "parked"],
        ["q.p00", "q.p02"],
    )
    assert split(queues, parts, None) == (queues, [])  # no index: everything at once
    assert split(queues, parts, Share(5, 6)) == (["plain", "parked"], [*parts])


def test_a_share_reads_from_the_environment_and_splits_over_children() -> None:
    assert Share.from_environ({}) is None
    assert Share.from_environ({"DJANGO_RMQ_RETRY_PROCESS": " 1/3 "}) == Share(1, 3)
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(ValueError, match="i/n"):
            Share.from_environ({"DJANGO_RMQ_RETRY_PROCESS": bad})
    # host 1 of 2 running 3 children: its children are processes 3, 4 and 5 of 6
    assert [Share(1, 2).child(n, 3) for n in range(3)] == [Share(3, 6), Share(4, 6), Share(5, 6)]
    assert str(Share(0, 1).child(1, 2)) == "1/2"


def test_the_supervisor_gives_each_child_its_index(tmp_path: Path) -> None:
    said = tmp_path / "said"
    write = f"import os; open({str(said)!r}, 'a').write(os.environ[{ENV!r}] + '\\n')"
    sup = Supervisor([sys.executable, "-c", write], 2, share=Share(1, 2), before_start=lambda: None)
    assert sup.run() == 0
    assert sorted(said.read_text().split()) == ["2/4", "3/4"]


@pytest.fixture
def orderapp_registered(registry_snapshot: None) -> Any:
    """The ordered receiver of tests/orderapp in the registry (reloaded: registered again)."""
    from tests.orderapp import receivers

    for rec in default_registry.all():
        if rec.name.startswith(receivers.__name__ + "."):
            default_registry.unregister(rec.func)
    return importlib.reload(receivers)


class _Channel(StandbyConsumers):
    """The mixin as the dispatcher holds it, recording what it consumes."""

    def __init__(self, share: Share | None) -> None:
        rec = next(r for r in default_registry.all() if r.ordering_key is not None)
        self._init_standby(share, [rec], "pfx", 4)
        self.queues = [*self._partition_of, "pfx.plain"]
        self.consumed: list[str] = []
        self._stop = threading.Event()
        self._winding_down = False
        self._breakers = DependencyConsumers({}, 10)

    def _consume(self, queue_name: str) -> None:
        self.consumed.append(queue_name)

    def tags_of(self, queue: str) -> list[str]:
        return [queue] if queue in self.consumed else []


def test_standbys_wait_for_the_grace_and_a_queue_consumed_meanwhile_is_left(
    orderapp_registered: None,
) -> None:
    channel = _Channel(Share(0, 2))
    p0, p1, p2, p3 = channel._partition_of
    before = time.monotonic()
    assert channel._first_queues(channel.queues) == [p0, p2, "pfx.plain"]
    assert channel._standby_at >= before + STANDBY_GRACE
    channel.consumed.append(p3)  # e.g. a breaker resumed it on a tick
    channel._consume_standby()
    assert channel.consumed == [p3]  # not yet
    channel._standby_at = time.monotonic()  # the grace is over
    channel._consume_standby()
    channel._consume_standby()  # once
    assert channel.consumed == [p3, p1]
    stopping = _Channel(Share(0, 2))
    stopping._first_queues(stopping.queues)
    stopping._standby_at = time.monotonic()
    stopping._stop.set()
    stopping._consume_standby()
    assert stopping.consumed == []


# On RabbitMQ ------------------------------------------------------------------------------
@pytest.fixture
def orderapp(orderapp_registered: Any, rmq: Any) -> Any:
    """The ordered receiver with its partition queues declared (the publisher sets the
    partition header)."""
    rmq.setup()
    return orderapp_registered


@pytest.fixture
def supervisor(rmq: Any) -> Iterator[list[Child]]:
    """``rmq_consume --processes 2``, stopped warm at the end (killed if it lingers)."""
    started: list[Child] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except Exception:
                proc.kill()
        proc.communicate(timeout=10)


def _consumers(queues: list[str]) -> Counter[str]:
    """Consumers per queue of ``queues``, as ``rabbitmqctl list_consumers`` lists them (a
    quorum queue's declare-ok counts only the active one)."""
    out = subprocess.run(
        rabbitmqctl_cmd("list_consumers", "-q", "-p", "/", "queue_name"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Counter(line.strip() for line in out.splitlines() if line.strip() in queues)


def _applied(log: Path) -> list[dict[str, Any]]:
    return [e for e in read_log(log) if e["receiver"] == "apply" and e["event"] == "done"]


def _send_round(orderapp: Any, n: int) -> None:
    orderapp.account_events.send_many([{"account": k, "n": n} for k in KEYS])


def _partitions_by_pid(events: list[dict[str, Any]]) -> dict[int, set[int]]:
    by_pid: dict[int, set[int]] = defaultdict(set)
    for e in events:
        by_pid[e["pid"]].add(partition_of(e["key"], 4))
    return dict(by_pid)


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_processes_each_take_two_partitions_and_one_takes_all_after_a_kill(
    orderapp: Any, rmq: Any, supervisor: list[Child]
) -> None:
    assert ordering_partitions() == 4
    assert {partition_of(k, 4) for k in KEYS} == {0, 1, 2, 3}
    queue = default_registry.find("apply", rmq.prefix).queue_name(rmq.prefix)
    partitions = [Names.partition_queue(queue, p) for p in range(4)]
    supervisor.append(start_consumer(rmq.prefix, rmq.log, "--processes", "2", **CHILD))
    # both children consume every partition: their own ones, then (after the grace) the
    # other's as a standby
    assert wait_for(
        lambda: _consumers(partitions) == dict.fromkeys(partitions, 2),
        timeout=60 + STANDBY_GRACE,
        interval=0.5,
    ), (_consumers(partitions), supervisor[0].output()[-3000:])

    for n in range(3):
        _send_round(orderapp, n)
    assert wait_for(lambda: len(_applied(rmq.log)) == 3 * len(KEYS), timeout=120, interval=0.2)
    first = _applied(rmq.log)
    spread = _partitions_by_pid(first)
    assert sorted(map(sorted, spread.values())) == [[0, 2], [1, 3]], spread

    # SIGKILL one child (the supervisor starts another): its standby peer takes its share
    victim, survivor = sorted(spread, key=lambda pid: min(spread[pid]))
    os.kill(victim, signal.SIGKILL)
    for n in range(3, 6):
        _send_round(orderapp, n)
    assert wait_for(lambda: len(_applied(rmq.log)) == 6 * len(KEYS), timeout=120, interval=0.2)
    after = _applied(rmq.log)[len(first) :]
    assert _partitions_by_pid(after) == {survivor: {0, 1, 2, 3}}
    by_key: dict[str, list[int]] = defaultdict(list)
    for e in _applied(rmq.log):
        by_key[e["key"]].append(e["n"])
    assert all(ns == list(range(6)) for ns in by_key.values()), by_key
