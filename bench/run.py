#!/usr/bin/env python
"""Run the benchmark suite and print one table: figure, ours, raw pika, ratio, target, met?

    .venv/bin/python bench/run.py            # everything (several minutes)
    .venv/bin/python bench/run.py --quick    # smaller counts and shorter delays
    .venv/bin/python bench/run.py happy delay   # only these scenarios

Scenarios: happy, publishing, retry, delay, parking, requeue, growth, io, lateness, tasks, peers. Needs RabbitMQ
(RMQ_URL) and, for parking/requeue on PostgreSQL, a server at BENCH_PG_URL (an admin URL;
the run creates and drops its own database). Every run uses a fresh prefix and deletes its
queues, exchanges, database and files at the end, also when it fails.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, Run, machine, setup_django, table

ORDER = [
    "happy",
    "publishing",
    "retry",
    "delay",
    "parking",
    "requeue",
    "outbox",
    "growth",
    "observability",  # metrics + tracing on vs off, happy and retry paths
    "typed",  # a typed receiver's cost per message (msgspec, pydantic, dataclass; no broker)
    "ordering",  # an ordered receiver (ordering_key) with no failures vs the same unordered
    "io",  # 50 ms of I/O per message: threads, async def, and the peers' best pools
    "lateness",  # RabbitMQ 4.3: retry lateness, cascade vs quorum-native (bench/lateness.py)
    "tasks",  # Django tasks: ours vs django-tasks-db, django-ox, the Celery bridge (bench/tasks.py)
    "peers",  # Dramatiq and Celery (bench/peers); a "skipped" row unless `pip install --group peers`
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", choices=[[], *ORDER], metavar="SCENARIO")
    parser.add_argument("--quick", action="store_true", help="Smaller counts, shorter delays.")
    args = parser.parse_args(argv)
    wanted = args.scenarios or ORDER
    run = Run(quick=args.quick)
    rows: list[Row] = []
    failed = []
    started = time.monotonic()
    try:
        setup_django(run)
        from bench.io_bound import io
        from bench.lateness import lateness
        from bench.ordering import ordering
        from bench.peers.scenario import peers
        from bench.scenarios import SCENARIOS
        from bench.tasks import tasks

        scenarios = {
            **SCENARIOS,
            "io": io,
            "lateness": lateness,
            "ordering": ordering,
            "peers": peers,
            "tasks": tasks,
        }  # bench/peers: optional peers, last
        for name in ORDER:
            if name not in wanted:
                continue
            t0 = time.monotonic()
            print(f"· {name} ...", file=sys.stderr, flush=True)
            got = None
            for attempt in (1, 2, 3):
                try:
                    got = scenarios[name](run)
                    break
                except Exception:
                    traceback.print_exc()
                    # Other work on a shared machine may cut the broker off for a while:
                    # wait for it, empty this run's queues and run the scenario again.
                    if attempt == 3 or not run.wait_for_broker_and_reset():
                        break
                    print(f"  retrying {name} (attempt {attempt + 1})", file=sys.stderr)
            if got is None:
                failed.append(name)
                continue
            rows.extend(got)
            print(f"  {name} done in {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
            for r in got:
                print("  " + table([r]).splitlines()[-1], file=sys.stderr, flush=True)
    finally:
        run.cleanup()
    print()
    print(f"django-rmq-retry benchmarks{' (--quick)' if run.quick else ''}: {machine()}")
    print(f"total {time.monotonic() - started:.0f}s, prefix {run.prefix}")
    print()
    print(table(rows))
    if failed:
        print(f"\nFAILED scenarios: {', '.join(failed)} (see the tracebacks above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
