#!/usr/bin/env python
"""What observability costs per message, in one process, without the broker.

    .venv/bin/python bench/obs_cost.py                 # every part, happy and retry paths
    .venv/bin/python bench/obs_cost.py --n 20000 --rounds 5
    .venv/bin/python bench/obs_cost.py --instructions --n 2000   # valgrind: ~20 min

Drives the consumer's handler (``consumer.handler``: a delivery in, an action out, the
receiver run in between) the way the I/O loop does, with each part of observability on in
turn, and prints microseconds per message above "off" for each. Two more rows need no
consumer: ``sdk span`` makes the same spans (same name, kind, attributes, links, events)
straight through the OpenTelemetry SDK, and ``prometheus`` makes the same metric updates
straight through prometheus-client: what those libraries cost by themselves. What a part
costs above those is ours.

Each part runs in a process of its own (OpenTelemetry allows one tracer provider per
process), with the SDK set up as ``bench/settings.py`` sets it for the ``observability``
scenario: a batch span processor to an exporter that drops the spans. ``--one PART`` runs
one part in this process (under a profiler, py-spy for one).

``--instructions`` counts instructions instead of time (valgrind's callgrind, each part
run with ``--n 0`` and with ``--n N``: the difference over N is per message, start-up
excluded). Counts do not move with other load on the machine; times do, so a time worth
reporting is taken like any other benchmark figure, on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Parts, each a process: what is on there.
PARTS = {
    "off": "observability off (the baseline)",
    "metrics": "metrics (prometheus-client, private registry)",
    "tracing": "tracing, AlwaysOn sampler (SDK, batch processor, dropping exporter)",
    "tracing-10%": "tracing, ParentBased(TraceIdRatioBased(0.1)) sampler",
    "tracing-0%": "tracing, ParentBased(TraceIdRatioBased(0)): no trace recorded (the floor)",
    "both": "metrics + tracing, AlwaysOn",
    "both-10%": "metrics + tracing, 10 % sampled",
    "sdk span": "the same spans made by the SDK alone, AlwaysOn (no consumer)",
    "sdk span 0%": "the same spans made by the SDK alone, none recorded (no consumer)",
    "prometheus": "the same metric updates by prometheus-client alone (no consumer)",
}


def sdk(sampler: str | None) -> Any:
    """Set the process's tracer provider as bench/settings.py does for the scenario."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    kwargs = {}
    if sampler is not None:
        kwargs["sampler"] = ParentBased(TraceIdRatioBased(float(sampler)))
    provider = TracerProvider(**kwargs)
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    return provider


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def one(part: str, path: str, n: int, rounds: int) -> list[float]:
    """Seconds per message of ``rounds`` runs of ``n`` messages of ``path``."""
    setup()
    from django_rmq_retry import hooks, observability
    from django_rmq_retry.consumer.actions import Delivery
    from django_rmq_retry.consumer.handler import Handler
    from django_rmq_retry.core.backoff import Policy
    from django_rmq_retry.core.delays import DelayLevels
    from django_rmq_retry.core.errors import Retry
    from django_rmq_retry.core.names import Names
    from django_rmq_retry.registry import Registry, TopicKey

    sampler = "0.1" if part.endswith("10%") else "0" if part.endswith("0%") else None
    if part.startswith(("tracing", "both", "sdk")):
        sdk(sampler)
    if part not in ("off", "prometheus") and not part.startswith("sdk"):
        observability.enable(
            metrics=part in ("metrics", "both", "both-10%"),
            tracing=part != "metrics",
            liveness_timeout=60,
        )

    def noop(message: Any, **kwargs: Any) -> None:
        pass

    def fails(message: Any, **kwargs: Any) -> None:
        raise Retry(delay=1.0)

    func = fails if path == "retry" else noop
    func.__module__ = "bench.obs"
    rec = Registry().register(func, [TopicKey("bench.obs")])
    names = Names("rmq_obs_cost")
    policy = Policy(max_attempts=5, initial_delay=1.0, multiplier=2.0, max_delay=60)
    handler = Handler(names, DelayLevels(100, 23), limits=None, policy_for=lambda r: policy)
    queue = rec.queue_name(names.prefix)
    props = {"content_type": "application/json", "delivery_mode": 2, "headers": {}}
    deliveries = [
        Delivery(
            queue,
            rec,
            "",
            "bench.obs",
            False,
            {**props, "message_id": f"m{i}", "headers": {}},
            b'{"i": %d}' % i,
            tag=i + 1,
        )
        for i in range(max(n, 1))
    ]
    outcome = "retried" if path == "retry" else "acked"

    if part.startswith("sdk"):
        return alone_sdk(deliveries[:n], rounds, path)
    if part == "prometheus":
        return alone_prometheus(deliveries[:n], rounds, path)
    current = hooks.current
    per: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for d in deliveries[:n]:
            handler.handle(d)
            if current is not None:
                current.settled(rec.name, d.queue, outcome)
        per.append((time.perf_counter() - t0) / max(n, 1))
    return per


def alone_sdk(deliveries: list[Any], rounds: int, path: str) -> list[float]:
    """The process span of each attempt (and, on the retry path, its exception and retry
    event, and the context the copy carries), by the SDK alone."""
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = trace.get_tracer("bench")
    w3c = TraceContextTextMapPropagator()
    error = RuntimeError("boom")
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for d in deliveries:
            destination = f"{d.exchange}:{d.routing_key}:{d.queue}"
            span = tracer.start_span(
                f"process {destination}",
                context=context.Context(),
                kind=SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "rabbitmq",
                    "messaging.operation.type": "process",
                    "messaging.operation.name": "process",
                    "messaging.destination.name": destination,
                    "messaging.rabbitmq.destination.routing_key": d.routing_key,
                    "django_rmq_retry.receiver": "r",
                    "django_rmq_retry.attempt": 1,
                    "messaging.message.id": d.properties["message_id"],
                },
            )
            token = context.attach(trace.set_span_in_context(span))
            if path == "retry":
                carrier: dict[str, str] = {}
                w3c.inject(carrier)
                span.record_exception(error)
                span.add_event("retry", {"django_rmq_retry.retry.delay_seconds": 1.0})
                span.set_attribute("django_rmq_retry.outcome", "retry")
            else:
                span.set_attribute("django_rmq_retry.outcome", "ack")
            span.end()
            context.detach(token)
        per.append((time.perf_counter() - t0) / max(len(deliveries), 1))
    return per


def alone_prometheus(deliveries: list[Any], rounds: int, path: str) -> list[float]:
    """The metric updates of each message (in flight up and down, one duration, one
    counter), by prometheus-client alone, on children looked up once."""
    from prometheus_client import CollectorRegistry

    from django_rmq_retry.observability.metrics import ConsumerMetrics

    m = ConsumerMetrics(CollectorRegistry())
    in_flight, duration = m.in_flight.labels("r"), m.duration.labels("r")
    counter = m.messages.labels("r", "retried" if path == "retry" else "acked")
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _d in deliveries:
            in_flight.inc()
            started = time.perf_counter()
            duration.observe(time.perf_counter() - started)
            in_flight.dec()
            counter.inc()
        per.append((time.perf_counter() - t0) / max(len(deliveries), 1))
    return per


def instructions(part: str, path: str, n: int) -> int:
    """Instructions (valgrind's ``Ir``) of one run of ``part`` on ``path`` with ``n``."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out"]
        this = [sys.executable, __file__, "--one", part, "--path", path]
        out = subprocess.run(
            [*tool, *this, "--n", str(n), "--rounds", "1"],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{out[-2000:]}")
    return int(found.group(1))


def count_all(n: int, parts: list[str]) -> int:
    """Print instructions per message of each part and path (two valgrind runs at once)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(part, "happy", 0) for part in parts]
    jobs += [(part, path, n) for part in parts for path in ("happy", "retry")]
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(jobs, pool.map(lambda job: instructions(*job), jobs), strict=True))
    per = {(part, path): (got[part, path, n] - got[part, "happy", 0]) / n for part, path, _ in jobs}
    print(f"instructions per message (callgrind, {n:,} messages less start-up)")
    print(f"{'part':<12} {'happy':>9} {'+off':>9} {'retry':>9} {'+off':>9}  what")
    for part in parts:
        row = [f"{part:<12}"]
        for path in ("happy", "retry"):
            own = per[part, path]
            alone = part.startswith(("sdk", "prometheus")) or "off" not in parts
            row.append(f"{own:9,.0f} {own - (0 if alone else per['off', path]):+9,.0f}")
        print(" ".join(row) + f"  {PARTS[part]}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", choices=list(PARTS), help="run one part here")
    parser.add_argument("--path", choices=["happy", "retry"], default="happy")
    parser.add_argument("--instructions", action="store_true", help="count (valgrind)")
    parser.add_argument("--parts", help="comma-separated parts (default: all)")
    args = parser.parse_args()
    if args.instructions:
        return count_all(args.n, args.parts.split(",") if args.parts else list(PARTS))
    if args.one:
        per = one(args.one, args.path, args.n, args.rounds)
        print(json.dumps(per))
        return 0
    results: dict[tuple[str, str], float] = {}
    counts = ["--n", str(args.n), "--rounds", str(args.rounds)]
    for path in ("happy", "retry"):
        for part in PARTS:
            out = subprocess.run(
                [sys.executable, __file__, "--one", part, "--path", path, *counts],
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
            ).stdout
            results[path, part] = min(json.loads(out.splitlines()[-1]))
    print(f"µs per message, fastest of {args.rounds} rounds of {args.n:,} (the least disturbed)")
    print(f"{'part':<12} {'happy':>8} {'+off':>8} {'retry':>8} {'+off':>8}  what")
    for part, what in PARTS.items():
        row = [f"{part:<12}"]
        for path in ("happy", "retry"):
            us = results[path, part] * 1e6
            base = 0.0 if part.startswith(("sdk", "prometheus")) else results[path, "off"] * 1e6
            row.append(f"{us:8.2f} {us - base:+8.2f}")
        print(" ".join(row) + f"  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
