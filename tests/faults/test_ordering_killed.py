"""Per-key order under three ``rmq_consume`` processes, one SIGKILLed twice.

200 keys x 15 events (``ordering_key="account"``, tests/orderapp), published in order per
key; 10 % of first attempts fail (chosen with a fixed seed), so their keys are held while
their retries wait. One consumer is SIGKILLed twice mid-run and started again each time.
Then: every key's events were applied in publish order (the first time each event ran; a
redelivery after a kill may run one again, counted as a duplicate), none lost, no key left
held. Publish-to-done of keys without a failure is reported (not asserted: speed lives in
bench/). Then a key whose first event is parked stays held (its later events wait as held
rows, none runs) until a requeue of the parked row releases them, in order.
"""

from __future__ import annotations

import importlib
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from django_rmq_retry import parking
from django_rmq_retry.models import HeldMessage, KeyHold, ParkedMessage
from django_rmq_retry.registry import default_registry
from tests.conftest import read_log, wait_for
from tests.faults.conftest import kill, queues_empty, record, spawn, stop

pytestmark = [
    pytest.mark.broker,
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

KEYS, EVENTS = 200, 15
FAIL_SHARE = 0.10
CHILD = {"DJANGO_SETTINGS_MODULE": "tests.faults.ordering_settings"}


@pytest.fixture
def orderapp(registry_snapshot: None, rmq: Any) -> Any:
    """The ordered receiver registered here too: the topology (its partition queues) and
    the publisher's partition header need it."""
    from tests.orderapp import receivers

    for rec in default_registry.all():
        if rec.name.startswith(receivers.__name__ + "."):
            default_registry.unregister(rec.func)
    module = importlib.reload(receivers)
    rmq.setup()
    return module


def _done(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in log if e["receiver"] == "apply" and e["event"] == "done"]


def _order_report(log: list[dict[str, Any]]) -> tuple[dict[str, list[int]], int]:
    """Per key, the events in the order they were first applied; and the duplicates."""
    first: dict[str, list[int]] = defaultdict(list)
    seen: set[tuple[str, int]] = set()
    duplicates = 0
    for e in _done(log):
        pair = (e["key"], e["n"])
        if pair in seen:
            duplicates += 1
            continue
        seen.add(pair)
        first[e["key"]].append(e["n"])
    return first, duplicates


def _stuck(rmq: Any, applied: int, total: int) -> str:
    """What a run that did not settle left: the holds, their rows, their keys' events."""
    lines = [f"not settled: {applied} of {total} applied"]
    log = read_log(rmq.log)
    for hold in KeyHold.objects.all():
        rows = list(HeldMessage.objects.filter(hold=hold).values_list("id", "message_id"))
        lines.append(
            f"hold {hold.key}: {hold.state} blocker={hold.blocker} upto={hold.released_upto} "
            f"changed={hold.changed_at:%H:%M:%S.%f} rows={rows}"
        )
        lines += [f"  {e}" for e in log if e.get("key") == hold.key]
    return "\n".join(lines)


def test_order_per_key_holds_through_retries_and_kills(
    orderapp: Any, rmq: Any, procs: list[Any], tmp_path: Path
) -> None:
    rng = random.Random(45)
    keys = [f"acct-{i:03d}" for i in range(KEYS)]
    failing = {(k, n) for k in keys for n in range(EVENTS) if rng.random() < FAIL_SHARE}
    # Each its place among the three (as three hosts would be told): each applies its share
    # of the partitions and stands by for the others.
    place = [{"DJANGO_RMQ_RETRY_PROCESS": f"{i}/3"} for i in range(3)]
    consumers = [spawn(rmq, **CHILD, **place[i]) for i in range(3)]
    procs.extend(consumers)
    for n in range(EVENTS):  # one send_many per round: each key's events in publish order
        orderapp.account_events.send_many(
            [
                {"account": k, "n": n, "sent": time.time(), "fail_first": (k, n) in failing}
                for k in keys
            ]
        )
    total = KEYS * EVENTS

    def applied() -> int:
        return len({(e["key"], e["n"]) for e in _done(read_log(rmq.log))})

    for kills, threshold in enumerate((total // 4, total // 2)):  # one SIGKILL each
        assert wait_for(lambda t=threshold: applied() >= t, timeout=240, interval=0.2), (
            f"stuck at {applied()} of {total} before kill {kills + 1}"
        )
        # the victim: a consumer active on a partition now (the last events are its)
        busy = {e["pid"] for e in _done(read_log(rmq.log))[-20:]}
        victim = next((i for i, p in enumerate(consumers) if p.pid in busy), 0)
        kill(consumers[victim])
        consumers[victim] = spawn(rmq, **CHILD, **place[victim])
        procs.append(consumers[victim])
    settled = wait_for(
        lambda: applied() == total and not KeyHold.objects.exists() and queues_empty(rmq),
        timeout=300,
        interval=0.5,
    )
    log = read_log(rmq.log)
    first, duplicates = _order_report(log)
    out_of_order = sorted(k for k, ns in first.items() if ns != sorted(ns))
    lost = total - sum(len(ns) for ns in first.values())
    clean_keys = {k for k in keys if not any((k, n) in failing for n in range(EVENTS))}
    latencies = sorted(
        e["t"] - e["sent"] for e in _done(log) if e["key"] in clean_keys and e["attempt"] == 1
    )
    median = statistics.median(latencies) if latencies else float("nan")
    record(
        "per-key order: 3 consumers, one SIGKILLed twice",
        published=total,
        handled=total - lost,
        parked=ParkedMessage.objects.count(),
        duplicates=duplicates,
        lost=lost,
        notes=(
            f"{len(failing)} first attempts failed; keys out of order: {len(out_of_order)}; "
            f"median publish-to-done of the {len(clean_keys)} keys without a failure "
            f"{median:.2f}s (reported, not asserted)"
        ),
    )
    span = max(e["t"] for e in _done(log)) - min(e["sent"] for e in _done(log))
    print(f"\nORDERING median publish-to-done (keys without failures): {median:.3f}s")
    print(f"ORDERING all {total} applied within {span:.1f}s of the first send")
    assert settled, _stuck(rmq, applied(), total)
    assert out_of_order == [], {k: first[k] for k in out_of_order[:5]}
    assert lost == 0
    assert sorted(first) == keys and all(ns == list(range(EVENTS)) for ns in first.values())
    assert ParkedMessage.objects.count() == 0  # a failing first attempt succeeds on its retry
    assert not HeldMessage.objects.exists()

    # A parked blocker holds its key until a requeue releases it, in order ------------------
    flag = tmp_path / "down"
    flag.write_text("down")
    key = "acct-parked"
    orderapp.account_events.send({"account": key, "n": 0, "hold_flag": str(flag)})
    for n in range(1, 5):
        orderapp.account_events.send({"account": key, "n": n})
    assert wait_for(
        lambda: (
            KeyHold.objects.filter(key=key, state="parked").exists()
            and HeldMessage.objects.filter(hold__key=key).count() == 4
        ),
        timeout=120,
        interval=0.2,
    ), list(KeyHold.objects.values_list("key", "state"))
    assert [e for e in _done(read_log(rmq.log)) if e["key"] == key] == []
    flag.unlink()
    assert parking.requeue(ParkedMessage.objects.filter(status="parked")).requeued == 1
    assert wait_for(
        lambda: (
            len([e for e in _done(read_log(rmq.log)) if e["key"] == key]) >= 5
            and not KeyHold.objects.exists()
        ),
        timeout=120,
        interval=0.2,
    )
    assert [e["n"] for e in _done(read_log(rmq.log)) if e["key"] == key] == [0, 1, 2, 3, 4]
    for p in consumers:
        stop(p)
