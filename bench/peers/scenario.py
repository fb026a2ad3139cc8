"""The ``peers`` scenario: ours, Dramatiq and Celery (solo pool, and threads pool) doing the
same work on the same broker in the same run, each as a ratio to the same raw-pika twin
(``bench/raw.py``).

Three measurements, every worker one process with prefetch ``PREFETCH`` (20), timed from its
first call to its last success (``bench/peers/record.py``), start-up excluded:

a. consume + ack, no-op: N messages pre-published into each system's queue; rounds with the
   order of the five rotating, the median kept.
b. retry once after 1 s: every message fails its first attempt, asks for a retry after 1 s
   and succeeds on the second; completion time (first call → last success) as msg/s, and the
   retries' lateness (second attempt − first failure − 1 s), pooled over the rounds.
c. head-of-line: one message retried after 30 s (``--quick``: 10 s) fails first, then 100
   messages retried after 1 s; the 1 s retries' lateness. The raw twin is the naive single
   delay queue (per-message TTL, dead-lettered back), which blocks them behind the long one.

In the table a peer's figure stands in the first value column ("ours"), with the system named
in the figure; the raw column is always the raw twin of the same rows, and the target column
says whether ours was ahead of that peer ("ours ≥ it" for throughput, "ours ≤ it" for
lateness). Each round checks the work: every system's call count, every message's first
failure and success, and every queue (delay queues included) empty afterwards.
"""

from __future__ import annotations

import json
import statistics
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import (
    BROKER_URL,
    Row,
    Run,
    Timed,
    declare_raw_queue,
    pct,
    publish_bodies,
    queue_name,
    raw_cmd,
    run_timed,
    wait_depth,
)
from bench.peers.record import lateness
from bench.scenarios import PREFETCH, ensure_empty, ours_consume, raw_consume

SKIPPED = "peers (Dramatiq, Celery): skipped: pip install --group peers"
# The order of the first round (then rotated). "celery" runs the solo pool, "celerythreads" the
# threads pool with one thread: the fastest pool for a no-op task is solo, but the two differ
# much on retries (bench/README.md), so both are shown.
SYSTEMS = ["ours", "dramatiq", "celery", "celerythreads", "raw"]
PEERS = ["dramatiq", "celery", "celerythreads"]
MODULE = {"dramatiq": "dramatiq", "celery": "celery", "celerythreads": "celery"}
POOL = {"celery": "solo", "celerythreads": "threads"}


def installed() -> bool:
    try:
        import celery  # noqa: F401
        import dramatiq  # noqa: F401
    except ImportError:
        return False
    return True


class Peers:
    """Queue names of this run's peers and everything they create on the broker."""

    def __init__(self, run: Run) -> None:
        from bench.peers import celery_side, dramatiq_side

        self.run = run
        self.dramatiq = dramatiq_side
        self.celery = celery_side
        self.base = f"{run.prefix}.peers"
        self.queues: list[str] = []
        self.exchanges: list[str] = []
        celery = f"Celery {metadata.version('celery')}"
        self.label = {
            "ours": "ours",
            "dramatiq": f"Dramatiq {metadata.version('dramatiq')}",
            "celery": f"{celery} solo",
            "celerythreads": f"{celery} threads",
        }

    def module(self, side: str) -> Any:
        return self.dramatiq if MODULE[side] == "dramatiq" else self.celery

    def queue(self, side: str, mode: str) -> str:
        """The work queue of ``side`` for ``mode``; remembers every broker object it implies."""
        name = f"{self.base}.{side}.{mode}"
        for q in self.all_queues(side, name):
            if q not in self.queues:
                self.queues.append(q)
                self.run.extra_queues.add(q)  # Run.cleanup deletes them too, whatever happens
        if MODULE.get(side) == "celery" and self.celery.exchange_for(name) not in self.exchanges:
            self.exchanges.append(self.celery.exchange_for(name))
        return name

    def all_queues(self, side: str, name: str) -> list[str]:
        return self.dramatiq.queues(name) if MODULE.get(side) == "dramatiq" else [name]

    def publish(self, side: str, mode: str, name: str, delays: dict[int, float | None]) -> None:
        self.module(side).publish(mode, name, list(delays.items()))

    def consume(self, side: str, mode: str, name: str, n: int, times: Path | None = None) -> Timed:
        mark = self.run.path("mark")
        mark.touch()
        cmd = [sys.executable, "-m", f"bench.peers.{MODULE[side]}_side", mode, name, str(n)]
        cmd += [str(PREFETCH), str(mark)] + ([str(times)] if times else [])
        env = self.run.env()
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the peers run as plain Python programs
        if side in POOL:
            env["BENCH_CELERY_POOL"] = POOL[side]
        return run_timed(cmd, env, mark, self.run.path(f"{side}-{mode}.log"), 900)

    def cleanup(self) -> None:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        ch = conn.channel()
        for name in self.queues:
            try:
                ch.queue_delete(name)
            except Exception:
                ch = conn.channel()
        for name in self.exchanges:
            try:
                ch.exchange_delete(name)
            except Exception:
                ch = conn.channel()
        conn.close()


def rotated(rnd: int) -> list[str]:
    k = rnd % len(SYSTEMS)
    return SYSTEMS[k:] + SYSTEMS[:k]


def publish_ours(routing_key: str, delays: dict[int, float | None]) -> None:
    """Publish ``{"i": i, "op": "bench", "delay": d}`` in order of ``i`` (runs of one delay
    at a time: ``publish_bodies`` confirms each batch before the next, so the order holds)."""
    items = sorted(delays.items())
    start = 0
    while start < len(items):
        stop = start
        while stop < len(items) and items[stop][1] == items[start][1]:
            stop += 1
        extra: dict[str, Any] = {} if items[start][1] is None else {"delay": items[start][1]}
        publish_bodies(routing_key, stop - start, start=items[start][0], **extra)
        start = stop


# a. consume + ack ------------------------------------------------------------------------
CONFIG = {
    "ours": "rmq_consume, 1 thread",
    "dramatiq": "RabbitmqBroker(confirm_delivery=True), 1 process × 1 thread",
    "celery": "solo pool, acks_late, multiplier 20 × 1, confirm_publish",
    "celerythreads": "threads pool × 1, acks_late, multiplier 20 × 1, confirm_publish",
}


def side_by_side(
    peers: Peers,
    figure: str,
    value: dict[str, float],
    unit: str,
    higher_is_better: bool,
    notes: dict[str, str] | None = None,
) -> list[Row]:
    """One row for ours and one per peer, each beside the raw twin; a peer's row says
    whether ours is at least as good as it (the issue's "ours ahead on every row")."""
    rows = []
    for key in ("ours", *PEERS):
        met = None
        if key != "ours":
            met = value["ours"] >= value[key] if higher_is_better else value["ours"] <= value[key]
        rows.append(
            Row(
                f"{figure}: {peers.label[key]}",
                value[key],
                value["raw"],
                unit,
                ("ours ≥ it" if higher_is_better else "ours ≤ it") if key != "ours" else "",
                met,
                note=(notes or {}).get(key, ""),
            )
        )
    return rows


def consume_rows(run: Run, peers: Peers) -> list[Row]:
    n = 5_000 if run.quick else 20_000
    rounds = 3
    queues = {
        "ours": queue_name("bench_noop"),
        "raw": declare_raw_queue(run, "happynoop", "bench.rawnoop"),
        **{side: peers.queue(side, "noop") for side in PEERS},
    }

    def step(key: str) -> Timed:
        if key == "ours":
            return ours_consume(run, "bench_noop", n)
        if key == "raw":
            return raw_consume(run, "consume", queues["raw"], n)
        return peers.consume(key, "noop", queues[key], n)

    seconds: dict[str, list[float]] = {k: [] for k in SYSTEMS}
    delays: dict[int, float | None] = dict.fromkeys(range(n))
    for rnd in range(rounds):
        publish_bodies("bench.noop", n)
        publish_bodies("bench.rawnoop", n)
        for side in PEERS:
            peers.publish(side, "noop", queues[side], delays)
        for q in queues.values():
            wait_depth(q, n)
        for key in rotated(rnd):
            t = step(key)
            if t.calls != n:
                raise RuntimeError(f"{key}: {t.calls} calls for {n} messages")
            seconds[key].append(t.seconds)
        progress(f"round {rnd + 1}", {k: f"{n / v[-1]:,.0f} msg/s" for k, v in seconds.items()})
        ensure_empty(*(q for side, name in queues.items() for q in peers.all_queues(side, name)))
    rate = {k: n / statistics.median(v) for k, v in seconds.items()}
    figure = f"peers a. consume + ack, no-op, {n:,} msgs, prefetch {PREFETCH}, median of {rounds}"
    return side_by_side(peers, figure, rate, "msg/s", True, CONFIG)


def progress(label: str, values: dict[str, str]) -> None:
    text = ", ".join(f"{k} {v}" for k, v in values.items())
    print(f"    peers {label}: {text}", file=sys.stderr, flush=True)


# b. and c. retries -----------------------------------------------------------------------
class RetryRound:
    """Each system's retry run: publish, consume, check, lateness per message."""

    def __init__(self, run: Run, peers: Peers) -> None:
        from django_rmq_retry.conf import current_plan
        from django_rmq_retry.registry import default_registry

        self.run = run
        self.peers = peers
        self.times: dict[str, Path] = {}  # each system's last times file
        self.ours_delay = [
            q.name for q in current_plan(default_registry.all()).queues if ".delay." in q.name
        ]
        raw_q = declare_raw_queue(run, "peerretry", "bench.rawpeerretry")
        self.raw_delay = declare_raw_queue(
            run,
            "peerretrydelay",
            None,
            **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": raw_q},
        )
        self.queues = {
            "ours": queue_name("bench_peer_retry"),
            "raw": raw_q,
            **{side: peers.queue(side, "retry") for side in PEERS},
        }

    def publish(self, delays: dict[int, float | None]) -> None:
        publish_ours("bench.peerretry", delays)
        publish_ours("bench.rawpeerretry", delays)
        for side in PEERS:
            self.peers.publish(side, "retry", self.queues[side], delays)
        for q in self.queues.values():
            wait_depth(q, len(delays))

    def consume(
        self, key: str, delays: dict[int, float | None], first: int | None = None
    ) -> tuple[Timed, dict[int, float]]:
        n = len(delays)
        times = self.times[key] = self.run.path(f"{key}-times.json")
        if key == "ours":
            t = ours_consume(
                self.run, "bench_peer_retry", 2 * n, timeout=900, BENCH_TIMES_FILE=str(times)
            )
        elif key == "raw":
            mark = self.run.path("mark")
            mark.touch()
            q = self.queues["raw"]
            cmd = raw_cmd("retryonce", q, n, PREFETCH, mark, self.raw_delay, times)
            t = run_timed(cmd, self.run.env(), mark, self.run.path("raw-retryonce.log"), 900)
        else:
            t = self.peers.consume(key, "retry", self.queues[key], n, times)
        if t.calls != n:
            raise RuntimeError(f"{key}: {t.calls} successes for {n} messages")
        return t, lateness(times, delays, key, first)

    def check_empty(self) -> None:
        ensure_empty(
            *self.ours_delay,
            self.raw_delay,
            *(q for side, name in self.queues.items() for q in self.peers.all_queues(side, name)),
        )


HOW = {
    "ours": "delay levels: TTL queues in RabbitMQ; the consumer holds only the landing "
    "(DELAY_LANDING_MS, the last 100 ms by default), unacked, within its prefetch window "
    "(SPARE_PREFETCH, off by default, lets a spare consumer widen it)",
    "dramatiq": "held unacked in worker memory (from <queue>.DQ) until due, then re-published",
    "celery": "eta message held unacked in worker memory on a timer",
    "celerythreads": "eta message held unacked in worker memory on a timer",
}


def retry_detail(times: Path, t: Timed, lat: dict[int, float]) -> dict[str, str]:
    """What the progress line says about one retry run: when the retries ran."""
    data = json.loads(times.read_text())
    fails, oks = sorted(data["fail"].values()), sorted(data["ok"].values())
    tail = oks[-max(1, len(oks) // 10) :]
    return {
        "completion": f"{t.seconds:.1f} s",
        "first attempts": f"{fails[-1] - fails[0]:.1f} s",
        "successes before the last first attempt": f"{sum(o < fails[-1] for o in oks):,}",
        "last 10 % of successes": f"{len(tail)} in {tail[-1] - tail[0]:.2f} s",
        "lateness p50": f"{pct(list(lat.values()), 0.5):,.0f} ms",
        "max": f"{max(lat.values()):,.0f} ms",
    }


def retry_rows(run: Run, peers: Peers, rr: RetryRound) -> list[Row]:
    n = 1_000 if run.quick else 2_000
    rounds = 3
    delays: dict[int, float | None] = dict.fromkeys(range(n), 1.0)
    seconds: dict[str, list[float]] = {k: [] for k in SYSTEMS}
    late: dict[str, list[float]] = {k: [] for k in SYSTEMS}
    for rnd in range(rounds):
        rr.publish(delays)
        for key in rotated(rnd):
            t, lat = rr.consume(key, delays)
            seconds[key].append(t.seconds)
            late[key].extend(lat.values())
            progress(f"retry round {rnd + 1}, {key}", retry_detail(rr.times[key], t, lat))
        rr.check_empty()
    rate = {k: n / statistics.median(v) for k, v in seconds.items()}
    figure = f"peers b. retry once after 1 s, {n:,} msgs"
    rows = side_by_side(peers, f"{figure}: completion, median of {rounds}", rate, "msg/s", True)
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        value = {k: pct(v, q) for k, v in late.items()}
        rows += side_by_side(
            peers, f"{figure}: lateness {label} of {rounds} × {n:,}", value, "ms", False
        )
    return rows


def hol_rows(run: Run, peers: Peers, rr: RetryRound) -> list[Row]:
    long = 10.0 if run.quick else 30.0
    short = 100
    delays: dict[int, float | None] = {0: long, **dict.fromkeys(range(1, short + 1), 1.0)}
    # Three rounds, pooled like the retry rows: one round's p99 is its second-worst copy,
    # and that moved by 2-4x between runs for every system (bench/README.md).
    rounds = 1 if run.quick else 3
    ones: dict[str, list[float]] = {k: [] for k in SYSTEMS}
    longs: dict[str, list[float]] = {k: [] for k in SYSTEMS}
    for rnd in range(rounds):
        rr.publish(delays)
        for key in rotated(rnd):
            _t, lat = rr.consume(key, delays, first=0)
            mine = [lat[i] for i in range(1, short + 1)]
            ones[key].extend(mine)
            longs[key].append(lat[0])
            progress(
                f"head-of-line round {rnd + 1}, {key}",
                {"p50": f"{pct(mine, 0.5):.2f} ms", "p99": f"{pct(mine, 0.99):.2f} ms",
                 "max": f"{max(mine):.2f} ms", "long": f"{lat[0]:,.0f} ms"},
            )  # fmt: skip
        rr.check_empty()
    stats = {
        key: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "max": max(v), "long": max(longs[key])}
        for key, v in ones.items()
    }
    figure = f"peers c. {short} retries after 1 s behind one after {long:.0f} s" + (
        f", {rounds} × {short} pooled" if rounds > 1 else ""
    )
    rows = []
    worst = " at worst" if rounds > 1 else ""
    notes = {
        key: f"{HOW[key]}; the {long:.0f} s retry {stats[key]['long']:,.0f} ms late{worst}"
        for key in ("ours", *PEERS)
    }
    notes["ours"] += (
        "; raw: one delay queue, per-message TTL: head-of-line blocked, its "
        f"{long:.0f} s retry {stats['raw']['long']:,.0f} ms late{worst}"
    )
    for label in ("p50", "p99", "max"):
        value = {key: stats[key][label] for key in stats}
        rows += side_by_side(
            peers,
            f"{figure}: lateness {label}",
            value,
            "ms",
            False,
            notes if label == "p50" else None,
        )
    return rows


def peers(run: Run) -> list[Row]:
    if not installed():
        print(f"  {SKIPPED}", file=sys.stderr, flush=True)
        return [Row(SKIPPED, None)]
    group = Peers(run)
    try:
        rows = consume_rows(run, group)
        rr = RetryRound(run, group)
        rows += retry_rows(run, group, rr)
        rows += hol_rows(run, group, rr)
    finally:
        group.cleanup()
    return rows
