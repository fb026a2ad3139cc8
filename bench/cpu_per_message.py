#!/usr/bin/env python
"""CPU time our consumer spends per message on the happy path, for telling commits apart.

    .venv/bin/python bench/cpu_per_message.py [N] [--runs 3]

Pre-publishes N no-op messages (default 60,000), runs ``rmq_consume bench_noop
--max-messages N`` and reads the child's user + system seconds from ``rusage``: CPU per
message, start-up included (about half a second of it; compare figures taken with the same
N). Why not msg/s: on a small shared host the wall clock of a run moves by ±20 % with other
work, while the CPU a process spent repeats within a microsecond or two per message, so a
change of a few percent in the consumer's cost shows here and drowns in ``run.py happy``.
To compare a commit, run this from a worktree of it with ``PYTHONPATH`` set to that tree.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, Run, manage_cmd, publish_bodies, queue_name, setup_django, wait_depth


def one_run(run: Run, n: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one consumer handling ``n`` pre-published messages."""
    publish_bodies("bench.noop", n)
    wait_depth(queue_name("bench_noop"), n)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(
        manage_cmd("rmq_consume", "bench_noop", "--max-messages", str(n), "--no-orphans"),
        cwd=ROOT,
        env=run.env("sqlite"),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    run = Run(quick=True)
    try:
        setup_django(run)
        per_message = []
        for _ in range(args.runs):
            cpu, wall = one_run(run, args.n)
            per_message.append(1e6 * cpu / args.n)
            print(
                f"{args.n} messages: CPU {cpu:.2f} s ({per_message[-1]:.1f} µs/message), wall {wall:.2f} s"
            )
        print(f"median: {statistics.median(per_message):.1f} µs/message")
    finally:
        run.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
