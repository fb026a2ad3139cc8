"""Dramatiq's side of the peers benchmark: its worker (run as a process) and its publisher.

    python -m bench.peers.dramatiq_side MODE QUEUE N PREFETCH MARKFILE [TIMESFILE]

MODE ``noop``: an actor that does nothing, stopped after N calls. MODE ``io``: an actor
that sleeps 50 ms (blocking I/O), stopped after N calls, on ``BENCH_DRAMATIQ_THREADS``
worker threads (greenlets with ``BENCH_DRAMATIQ_GEVENT=1``, as ``dramatiq-gevent`` runs). MODE ``retry``: an actor
whose first attempt of each message raises ``dramatiq.Retry(delay=<the message's delay>)``
and whose second attempt succeeds, stopped after N successes. Both write ``MARKFILE`` (and
``TIMESFILE``) as ``bench/peers/record.py`` says.

Configured at its best for this work, and like ours: ``RabbitmqBroker(confirm_delivery=True)``
(every enqueue, the retry's included, waits for the broker's confirm), one process with one
worker thread (ours: ``THREADS`` 1), the work queue's prefetch set to ours
(``dramatiq_queue_prefetch``), the delay queue's prefetch high enough to hold every delayed
message of a run (``dramatiq_delay_queue_prefetch``, default 1,000 per worker thread), and
``Worker(worker_timeout=100)`` (ms; default 1,000, or ``dramatiq_worker_timeout``: how long an
idle consumer waits before it looks at its held delayed messages again). Default middleware (its ``Retries`` included);
logging at INFO, what the ``dramatiq`` command sets (one line per retry, like ours).

How Dramatiq delays a message (``dramatiq/brokers/rabbitmq.py``, ``dramatiq/worker.py``): a
retry is a copy published to ``<queue>.DQ`` with an ``eta`` in its options; the worker
consumes that queue too, *holds* each delayed message unacked in a priority queue in memory
(up to the delay queue's prefetch) and, once its eta has passed, publishes it to the work
queue and acks the held copy. RabbitMQ only stores it: no head-of-line blocking, but a held
message occupies the worker's memory and a prefetch slot until it is due.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

URL = os.environ.get("RMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
WORKER_TIMEOUT_MS = 100
DELAY_PREFETCH = 10_000
ACTORS = {"noop": "bench_peer_noop", "retry": "bench_peer_retry", "io": "bench_peer_io"}
#: Worker threads (1 everywhere but the I/O-bound scenario); greenlets with BENCH_DRAMATIQ_GEVENT.
THREADS = int(os.environ.get("BENCH_DRAMATIQ_THREADS", "1"))
GEVENT = bool(os.environ.get("BENCH_DRAMATIQ_GEVENT"))
#: Seconds of I/O per message in ``io`` mode (a sleep; patched by gevent when it is on).
IO_SECONDS = 0.05


def queues(queue: str) -> list[str]:
    """Every queue Dramatiq declares for ``queue`` (work, delay, dead letters)."""
    return [queue, f"{queue}.DQ", f"{queue}.XQ"]


def publish(mode: str, queue: str, items: list[tuple[int, float]]) -> None:
    """Enqueue one message per ``(i, delay)`` for the ``mode`` actor (not timed; the
    benchmark waits for the queue's depth afterwards)."""
    from dramatiq import Message
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=URL)
    broker.declare_queue(queue, ensure=True)
    for i, delay in items:
        broker.enqueue(
            Message(
                queue_name=queue,
                actor_name=ACTORS[mode],
                args=(i, delay),
                kwargs={},
                options={},
            )
        )
    broker.close()


def main(argv: list[str]) -> int:
    mode, queue, n_text, prefetch, mark, *rest = argv
    n = int(n_text)
    if GEVENT:  # what the dramatiq-gevent command does before anything else
        from gevent import monkey

        monkey.patch_all()
    # Dramatiq reads these (lower-case) variables when its worker module is imported.
    os.environ["dramatiq_queue_prefetch"] = prefetch  # noqa: SIM112
    os.environ["dramatiq_delay_queue_prefetch"] = str(DELAY_PREFETCH)  # noqa: SIM112
    import dramatiq
    from dramatiq import Worker
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    from bench.peers.record import Recorder

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    broker = RabbitmqBroker(url=URL, confirm_delivery=True)
    dramatiq.set_broker(broker)
    rec = Recorder(mark, rest[0] if rest else None)
    done = threading.Event()

    def bench_peer_noop(i: int, delay: Any = None) -> None:
        rec.first()
        if rec.ok() >= n:
            done.set()

    def bench_peer_retry(i: int, delay: float) -> None:
        rec.first()
        if i not in rec.fails:  # one process: its memory knows the first attempts
            rec.failed(i)
            raise dramatiq.Retry(delay=round(delay * 1000))
        if rec.ok(i) >= n:
            done.set()

    def bench_peer_io(i: int, delay: Any = None) -> None:
        rec.first()
        time.sleep(IO_SECONDS)
        if rec.ok() >= n:
            done.set()

    fn = {"noop": bench_peer_noop, "retry": bench_peer_retry, "io": bench_peer_io}[mode]
    dramatiq.actor(fn, actor_name=ACTORS[mode], queue_name=queue, broker=broker, max_retries=3)
    worker = Worker(
        broker, queues={queue}, worker_threads=THREADS, worker_timeout=WORKER_TIMEOUT_MS
    )
    worker.start()
    finished = done.wait(timeout=float(os.environ.get("BENCH_PEER_TIMEOUT", "600")))
    worker.stop()  # workers first (their acks are queued), then consumers (acks sent)
    broker.close()
    rec.finish()
    if not finished:
        print(f"dramatiq worker: only {rec.count} of {n} calls", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
