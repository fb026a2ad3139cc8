#!/usr/bin/env python
"""Profile our consumer on one benchmark workload with py-spy (all threads sampled).

    .venv/bin/pip install py-spy          # bench-only tool, not a dependency
    .venv/bin/python bench/profile.py happy|retry|park|requeue|aio [N] [--db postgres] [--gil] [--rate 250]

Pre-publishes N messages, runs ``rmq_consume`` under ``py-spy record --format raw``, and
prints the functions with the most samples: own time ("self") and inclusive ("total"),
idle waits excluded. ``requeue`` seeds N parked rows instead and profiles
``parking.requeue()`` of them (``bench.dbtool requeue``). ``--gil``: only samples of the
thread holding the interpreter lock. Cleans up like ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, Run, manage_cmd, publish_bodies, setup_django, wait_depth

WORKLOADS = {"happy": ("bench_noop", "bench.noop"), "retry": ("bench_retry", "bench.retry"),
             "park": ("bench_park", "bench.park"), "requeue": ("bench_requeue", ""),
             "aio": ("bench_aio", "bench.aio")}  # fmt: skip


def summarise(raw: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    out = [f"{samples} samples (all threads, idle excluded)", "", "self:"]
    out += [f"  {100 * c / samples:5.1f}%  {f}" for f, c in own.most_common(top)]
    out += ["", "total (inclusive):"]
    out += [f"  {100 * c / samples:5.1f}%  {f}" for f, c in total.most_common(top * 2)]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("n", nargs="?", type=int, default=20_000)
    parser.add_argument("--db", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--gil", action="store_true", help="sample the GIL holder only")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the consumer")
    parser.add_argument("--prefetch", type=int, default=20, help="the consumer's --prefetch")
    parser.add_argument("--keep", type=Path, help="also copy py-spy's raw stacks to this file")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    run = Run(quick=True)
    try:
        setup_django(run)
        from bench.common import queue_name

        out = run.path("pyspy.txt")
        extra = dict(kv.split("=", 1) for kv in args.env)
        if args.workload == "requeue":
            tag = "profile"
            seed = [sys.executable, "-m", "bench.dbtool", "seed", str(args.n), tag]
            subprocess.run(seed, cwd=ROOT, env=run.env(args.db, **extra), check=True)
            cmd = [sys.executable, "-m", "bench.dbtool", "requeue", tag]
        else:
            short, key = WORKLOADS[args.workload]
            publish_bodies(key, args.n)
            wait_depth(queue_name(short), args.n)
            cmd = manage_cmd(
                "rmq_consume",
                short,
                "--max-messages",
                str(args.n),
                "--prefetch",
                str(args.prefetch),
            )
        record = [spy, "record", "--format", "raw", "--rate", str(args.rate), "-o", str(out)]
        subprocess.run(
            [*record, *(["--gil"] if args.gil else []), "--", *cmd],
            cwd=ROOT,
            env=run.env(args.db, **extra),
            check=True,
            stdout=None if args.workload == "requeue" else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if args.keep:
            shutil.copyfile(out, args.keep)
        print(summarise(out, args.top))
    finally:
        run.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
