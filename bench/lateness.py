#!/usr/bin/env python
"""Retry lateness of the two delay engines on RabbitMQ 4.3: the cascade's delay levels and
the quorum queues' own delayed retry (``DELAY_ENGINE = "quorum-native"``).

    RMQ_URL=amqp://guest:guest@127.0.0.1:5683/%2F .venv/bin/python bench/lateness.py
    .venv/bin/python bench/run.py lateness          # the same, as a scenario of the suite

For each engine and N in 1,000 and 10,000: N messages wait in the receiver's queue, then one
consumer (``rmq_consume bench_lateness``, prefetch 20, quorum queues) starts; every first
attempt fails, so all N retries fall due within the few seconds the consumer takes to fail
them; every second attempt succeeds. Lateness = the second attempt's start - (the first
attempt's failure + the delay), each time taken in the receiver (``bench/latenessapp``);
p50 / p99 / p99.9 over the N messages, then the median of each over 3 rounds (the engines'
order alternating; ``--quick``: one round, a 5 s delay). Each (engine, N) has a prefix of
its own, its topology deleted afterwards. Skipped (one row says so) on a broker older than 4.3.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BROKER_URL, ROOT, Row, Run, pct, table

SETTINGS = "bench.lateness_settings"
ENGINES = ("cascade", "quorum-native")
COUNTS = (1_000, 10_000)
#: Rounds of every (engine, N), the engines' order alternating; the rows give medians.
ROUNDS = 3
ROUTING_KEY = "bench.lateness"


@dataclass(frozen=True)
class Lateness:
    """One (engine, N) measurement, in milliseconds."""

    p50: float
    p99: float
    p999: float
    spread_s: float  # between the first and the last retry's due time


def lateness(run: Run) -> list[Row]:
    """The scenario's rows: one per engine and N (p99 as the figure, p50 / p99.9 noted)."""
    version = _broker_version()
    if _parse(version) < (4, 3, 0):
        return [
            Row(
                "retry lateness, cascade vs quorum-native",
                None,
                note=f"skipped: RabbitMQ {version} at RMQ_URL; the quorum-native engine needs 4.3+",
            )
        ]
    delay = 5.0 if run.quick else 10.0
    rounds = 1 if run.quick else ROUNDS
    got: dict[tuple[str, int], list[Lateness]] = {}
    for rnd in range(rounds):
        for n in COUNTS:
            for engine in ENGINES if rnd % 2 == 0 else ENGINES[::-1]:
                got.setdefault((engine, n), []).append(measure(run, engine, n, delay))
    rows = []
    for (engine, n), each in got.items():
        med = Lateness(
            p50=statistics.median(x.p50 for x in each),
            p99=statistics.median(x.p99 for x in each),
            p999=statistics.median(x.p999 for x in each),
            spread_s=statistics.median(x.spread_s for x in each),
        )
        rows.append(
            Row(
                f"retry lateness p99, {engine}, {n:,} due at once",
                med.p99,
                unit="ms",
                note=(
                    f"p50 {med.p50:.0f} ms, p99.9 {med.p999:.0f} ms (medians of {len(each)} "
                    f"rounds; p99 each round: {', '.join(f'{x.p99:.0f}' for x in each)} ms); "
                    f"dues within {med.spread_s:.1f} s; delay {delay:g} s; RabbitMQ {version}, "
                    "quorum queues, 1 consumer, prefetch 20"
                ),
            )
        )
    return rows


def measure(run: Run, engine: str, n: int, delay: float) -> Lateness:
    """Fail N messages once under ``engine`` and time their retries (module docstring)."""
    from django_rmq_retry.core.names import Names

    prefix = f"{run.prefix}l{uuid.uuid4().hex[:4]}"
    log = run.path(f"lateness-{engine}-{n}.log")
    env = run.env(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        RMQ_PREFIX=prefix,
        BENCH_LATENESS_ENGINE=engine,
        BENCH_LATENESS_DELAY=str(delay),
        BENCH_LATENESS_LOG=str(log),
    )
    out = run.path(f"lateness-{engine}-{n}.out").open("w")
    consumer = None
    try:
        subprocess.run(_manage("rmq_consume", "--setup-only"), cwd=ROOT, env=env, check=True)
        _publish(Names(prefix).work_exchange, prefix, n)
        consumer = subprocess.Popen(
            _manage("rmq_consume", "bench_lateness"),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + delay + 600
        while _count(log, "ok") < n:
            if consumer.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{engine}: {_count(log, 'ok')} of {n} retries succeeded")
            time.sleep(0.5)
    finally:
        if consumer is not None:
            consumer.terminate()
            consumer.wait(timeout=120)
        out.close()
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--delete-topology"],
            cwd=ROOT,
            env=env,
            check=False,
        )
    return _lateness(log, n, delay)


def _lateness(log: Path, n: int, delay: float) -> Lateness:
    failed: dict[str, float] = {}
    succeeded: dict[str, float] = {}
    for line in log.read_text().splitlines():
        kind, i, t = line.split()
        (failed if kind == "fail" else succeeded).setdefault(i, float(t))
    if len(failed) != n or set(succeeded) != set(failed):
        raise RuntimeError(f"{len(failed)} failed and {len(succeeded)} retried of {n}")
    late = [(succeeded[i] - failed[i] - delay) * 1000 for i in failed]
    dues = [t + delay for t in failed.values()]
    return Lateness(
        p50=pct(late, 0.5),
        p99=pct(late, 0.99),
        p999=pct(late, 0.999),
        spread_s=max(dues) - min(dues),
    )


def _publish(exchange: str, prefix: str, n: int) -> None:
    """N persistent JSON messages to the work exchange; returns once the queue holds them."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        ch = conn.channel()
        props = pika.BasicProperties(content_type="application/json", delivery_mode=2)
        for i in range(n):
            ch.basic_publish(exchange, ROUTING_KEY, json.dumps({"i": i}).encode(), props)
        queue = f"{prefix}.bench.latenessapp.receivers.bench_lateness"
        deadline = time.monotonic() + 120
        while ch.queue_declare(queue, passive=True).method.message_count < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{queue} never held the {n} messages published")
            time.sleep(0.1)
    finally:
        conn.close()


def _count(log: Path, kind: str) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.startswith(kind + " "))


def _manage(*args: str) -> list[str]:
    return [sys.executable, "manage.py", *args, "--settings", SETTINGS]


def _broker_version() -> str:
    from django_rmq_retry.broker.probes import server_version

    return server_version(BROKER_URL)


def _parse(version: str) -> tuple[int, int, int]:
    from django_rmq_retry.core.broker_rules import parse_version

    return parse_version(version) or (0, 0, 0)


def _delete_topology() -> None:
    """(A child with the scenario's settings) delete every queue and exchange of its prefix."""
    import django

    django.setup()
    import pika

    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.registry import default_registry

    the_plan = current_plan(default_registry.all())
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        ch = conn.channel()
        for q in the_plan.queues:
            ch.queue_delete(q.name)
        for name, _kind, _args in the_plan.exchanges:
            ch.exchange_delete(name)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="A 5 s delay instead of 10 s.")
    parser.add_argument("--delete-topology", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.delete_topology:
        _delete_topology()
        return 0
    from bench.common import setup_django

    run = Run(quick=args.quick)
    try:
        setup_django(run)
        rows = lateness(run)
    finally:
        run.cleanup()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
