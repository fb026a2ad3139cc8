#!/usr/bin/env python
"""What RabbitMQ itself adds to a delay: lateness through our delay levels, no consumer of ours.

    .venv/bin/python bench/hops.py [--rounds 3] [--n 100]

Raw pika publishes messages straight into the delay levels (the route ``Topic``'s retry copies
take: ``core.delays.route``) and a raw pika consumer reads them from a queue bound on the
deliver exchange; lateness = arrival − publish − delay. Delays chosen by how many levels they
cross at the default 100 ms resolution: 0.8 s (one level), 1 s (two: 0.8 + 0.2), 3.1 s (five:
1.6 + 0.8 + 0.4 + 0.2 + 0.1). The floor any broker-held delay has on this machine, and its
cost per level: what the peers' head-of-line row compares against a worker that holds its
retries in memory on a timer (``bench/README.md``, 2026-11-26).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BROKER_URL, Run, pct, setup_django

DELAYS = (0.8, 1.0, 3.1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100, help="messages per delay and round")
    args = parser.parse_args()
    run = Run(quick=True)
    try:
        setup_django(run)
        import pika

        from django_rmq_retry.conf import current_levels, current_names
        from django_rmq_retry.core.delays import route

        levels, names = current_levels(), current_names()
        conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        ch = conn.channel()
        queue = f"{run.prefix}.hops"
        ch.queue_declare(queue)
        ch.queue_bind(queue, names.deliver_exchange, arguments={names.target_header: queue})
        ch.confirm_delivery()
        late: dict[float, list[float]] = {d: [] for d in DELAYS}
        for _round in range(args.rounds):
            for delay in DELAYS:
                for i in range(args.n):
                    sent = time.time()
                    r = route(levels, names, delay, int(sent * 1_000_000))
                    body = json.dumps({"i": i, "sent": sent}).encode()
                    props = pika.BasicProperties(
                        headers={names.target_header: queue}, delivery_mode=2
                    )
                    ch.basic_publish(r.exchange, r.routing_key, body, props)  # confirmed
                for got, (method, _props, body) in enumerate(
                    ch.consume(queue, inactivity_timeout=delay + 10), 1
                ):
                    if method is None:
                        raise RuntimeError(f"{args.n - got + 1} message(s) of {delay} s never came")
                    arrived = time.time()
                    ch.basic_ack(method.delivery_tag)
                    late[delay].append((arrived - json.loads(body)["sent"] - delay) * 1000)
                    if got == args.n:
                        break
                ch.cancel()
        ch.queue_delete(queue)
        conn.close()
        print(f"lateness through the delay levels (ms), {args.rounds} × {args.n} per delay:")
        for delay in DELAYS:
            hops = len(levels.plan(delay * 1000).waits_in())
            values = late[delay]
            print(
                f"  {delay:>4} s, {hops} level(s): p50 {statistics.median(values):6.2f}  "
                f"p99 {pct(values, 0.99):6.2f}  max {max(values):6.2f}  min {min(values):6.2f}"
            )
        one, five = statistics.median(late[DELAYS[0]]), statistics.median(late[DELAYS[-1]])
        print(f"  per level (p50, 5 levels against 1): {(five - one) / 4:.2f} ms")
    finally:
        run.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
