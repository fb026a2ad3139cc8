"""Per-key order's cost: an ordered receiver with no failures beside the same no-op receiver
unordered (``bench_ordered`` and ``bench_noop``), one consumer process each, alternating
rounds, medians. The ordered one reads ``ORDERING_PARTITIONS`` partition queues and asks the
database, per message, whether its key is held (never, here: every message has its own key
and none fails)."""

from __future__ import annotations

import statistics

from bench.common import Row, Run, depth, publish_bodies, queue_name, wait_depth
from bench.scenarios import ROUNDS, ensure_empty, in_turn, ours_consume


def _partition_queues() -> list[str]:
    from django_rmq_retry.conf import app_settings, ordering_partitions
    from django_rmq_retry.core.topology_plan import receiver_queues
    from django_rmq_retry.registry import default_registry

    rec = default_registry.find("bench_ordered", app_settings.PREFIX)
    assert rec is not None
    return receiver_queues(rec, app_settings.PREFIX, ordering_partitions())


def ordering(run: Run) -> list[Row]:
    n = 2_000 if run.quick else 10_000
    partitions = _partition_queues()
    times: dict[str, list[float]] = {"ordered": [], "unordered": []}
    steps = [
        ("unordered", "bench_noop", "bench.noop"),
        ("ordered", "bench_ordered", "bench.ordered"),
    ]
    for rnd in range(ROUNDS):
        for name, short, routing in in_turn(steps, rnd):
            publish_bodies(routing, n)
            if name == "ordered":
                _wait_total(partitions, n)
            else:
                wait_depth(queue_name(short), n)
            timed = ours_consume(run, short, n)
            if timed.calls != n:
                raise RuntimeError(f"{name}: {timed.calls} receiver calls for {n}")
            times[name].append(timed.seconds)
        ensure_empty(queue_name("bench_noop"), *partitions)
    ordered = n / statistics.median(times["ordered"])
    unordered = n / statistics.median(times["unordered"])
    return [
        Row(
            f"ordered receiver (ordering_key), no failures, 1 process, {n:,} msgs",
            ordered,
            unordered,
            "msg/s",
            "≥ 0.70× unordered",
            ordered / unordered >= 0.7,
            note=f"'raw': the same no-op receiver unordered; SQLite; median of {ROUNDS}",
        )
    ]


def _wait_total(queues: list[str], expected: int, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while sum(depth(q) for q in queues) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the partitions hold {sum(depth(q) for q in queues)} of {expected}")
        time.sleep(0.05)
