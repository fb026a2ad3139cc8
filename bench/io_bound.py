"""The ``io`` scenario: receivers that wait 50 ms on I/O, one process, everyone at their best.

N messages (2,000; ``--quick``: 200; ``BENCH_IO_N`` overrides) pre-published into each system's queue; one worker
process consumes them, each message waiting 50 ms (a sleep: blocking in a thread, awaited on
an event loop, patched under gevent). The figure is msg/s from the first call to the last
(``bench/peers/record.py``), beside the ideal (concurrency ÷ 50 ms), and the process's peak
RSS (VmHWM). Configurations:

- ours, threads: ``THREADS`` at its default (1) and at 50 (``--threads``);
- ours, ``async def`` receiver: ``ASYNC_CONCURRENCY`` 50 and 200 on the receivers' own
  event loop (the default), and 200 on the consumer's I/O loop (``ASYNC_ON_IO_LOOP``);
- Celery: threads pool × 50, gevent pool × 200 (``acks_late``, confirms, as in ``peers``);
- Dramatiq: 50 worker threads, and 200 greenlets (``monkey.patch_all``, as ``dramatiq-gevent``).

Each worker's prefetch is its concurrency (at least ``PREFETCH``), so none waits for the
broker between messages. The peers need ``pip install --group peers`` (gevent included); without them their
rows say "skipped". ``BENCH_IO_ONLY`` (keys of ``CONFIGS``, comma-separated) runs only those,
for an A/B of one row (``ours-threads-1`` alone takes N × 50 ms).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from bench.common import Row, Run, Timed, publish_bodies, queue_name, wait_depth
from bench.scenarios import PREFETCH, ensure_empty, ours_consume

IO_SECONDS = 0.05

#: (key, label, kind, concurrency): kind "threads" / "async" for ours, else the peer's pool.
CONFIGS: list[tuple[str, str, str, int]] = [
    ("ours-threads-1", "ours, 1 receiver thread (THREADS default)", "threads", 1),
    ("ours-threads-50", "ours, 50 receiver threads", "threads", 50),
    ("ours-async-50", "ours, async def, ASYNC_CONCURRENCY 50", "async", 50),
    ("ours-async-200", "ours, async def, ASYNC_CONCURRENCY 200", "async", 200),
    (
        "ours-async-200-io",
        "ours, async def on the I/O loop (ASYNC_ON_IO_LOOP), ASYNC_CONCURRENCY 200",
        "async-io",
        200,
    ),
    ("celery-threads-50", "Celery threads pool × 50", "celery:threads", 50),
    ("celery-gevent-200", "Celery gevent pool × 200", "celery:gevent", 200),
    ("dramatiq-threads-50", "Dramatiq 50 threads", "dramatiq:threads", 50),
    ("dramatiq-gevent-200", "Dramatiq gevent × 200", "dramatiq:gevent", 200),
]


def peers_installed() -> bool:
    try:
        import celery  # noqa: F401
        import dramatiq  # noqa: F401
        import gevent  # noqa: F401
    except ImportError:
        return False
    return True


def io(run: Run) -> list[Row]:
    n = int(os.environ.get("BENCH_IO_N") or (200 if run.quick else 2_000))
    peers = None
    if peers_installed():
        from bench.peers.scenario import Peers

        peers = Peers(run)
    results: dict[str, tuple[float, float]] = {}
    only = {k for k in os.environ.get("BENCH_IO_ONLY", "").split(",") if k}
    try:
        for key, label, kind, concurrency in CONFIGS:
            if (":" in kind and peers is None) or (only and key not in only):
                continue
            t = _one(run, peers, key, kind, concurrency, n)
            if t.calls and t.calls != n:
                raise RuntimeError(f"{label}: {t.calls} calls for {n} messages")
            results[key] = (n / t.seconds, t.maxrss_mb)
            print(
                f"    io {label}: {n / t.seconds:,.0f} msg/s, peak {t.maxrss_mb:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if peers is not None:
            peers.cleanup()
    return _rows(results, n, peers is not None)


def _one(run: Run, peers: Any, key: str, kind: str, concurrency: int, n: int) -> Timed:
    prefetch = max(PREFETCH, concurrency)
    if kind in ("threads", "async", "async-io"):
        short = "bench_io" if kind == "threads" else "bench_aio"
        routing_key = "bench.io" if kind == "threads" else "bench.aio"
        publish_bodies(routing_key, n)
        wait_depth(queue_name(short), n)
        extra = ("--prefetch", str(prefetch))
        if kind == "threads":
            extra += ("--threads", str(concurrency))
        t = ours_consume(
            run,
            short,
            n,
            extra_args=extra,
            BENCH_ASYNC_CONCURRENCY=str(concurrency),
            BENCH_PREFETCH=str(prefetch),
            BENCH_ASYNC_ON_IO_LOOP="1" if kind == "async-io" else "0",
        )
        ensure_empty(queue_name(short))
        return t
    system, pool = kind.split(":")
    side = "celerythreads" if system == "celery" else "dramatiq"
    name = peers.queue(side, f"io-{pool}")
    peers.publish(side, "io", name, dict.fromkeys(range(n)))
    wait_depth(name, n)
    env_extra = (
        {"BENCH_CELERY_POOL": pool, "BENCH_CELERY_CONCURRENCY": str(concurrency)}
        if system == "celery"
        else {"BENCH_DRAMATIQ_THREADS": str(concurrency)}
        | ({"BENCH_DRAMATIQ_GEVENT": "1"} if pool == "gevent" else {})
    )
    t = _peer_consume(run, peers, side, name, n, prefetch, env_extra)
    ensure_empty(*peers.all_queues(side, name))
    return t


def _peer_consume(
    run: Run, peers: Any, side: str, name: str, n: int, prefetch: int, env_extra: dict[str, str]
) -> Timed:
    """``Peers.consume`` with this scenario's pool, size and prefetch."""
    from bench.common import run_timed
    from bench.peers.scenario import MODULE

    mark = run.path("mark")
    mark.touch()
    cmd = [sys.executable, "-m", f"bench.peers.{MODULE[side]}_side", "io", name, str(n)]
    cmd += [str(prefetch), str(mark)]
    env = run.env()
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update(env_extra)
    return run_timed(cmd, env, mark, run.path(f"{side}-io.log"), 900)


def _rows(results: dict[str, tuple[float, float]], n: int, with_peers: bool) -> list[Row]:
    figure = f"io. 50 ms I/O per msg, {n:,} msgs, 1 process"
    ours_best = results.get("ours-async-200-io", (0.0, 0.0))[0]
    rows = []
    for key, label, kind, concurrency in CONFIGS:
        if key not in results:
            continue
        rate, mb = results[key]
        ideal = concurrency / IO_SECONDS
        target, met = "", None
        if key == "ours-async-200-io":
            target, met = f"≥ 0.9 × ideal {ideal:,.0f}", rate >= 0.9 * ideal
        elif ":" in kind:
            target, met = "ours async 200 on the I/O loop ≥ it", ours_best >= rate
        rows.append(
            Row(
                f"{figure}: {label}",
                rate,
                None,
                "msg/s",
                target,
                met,
                ratio=rate / ideal,
                note=f"ideal {ideal:,.0f} msg/s (ratio column: of ideal); peak RSS {mb:.0f} MB",
            )
        )
    if not with_peers:
        rows.append(Row("io peers (Celery, Dramatiq): skipped: pip install --group peers", None))
    return rows
