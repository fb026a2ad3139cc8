"""Celery's side of the peers benchmark: its worker (run as a process) and its publisher.

    python -m bench.peers.celery_side MODE QUEUE N PREFETCH MARKFILE [TIMESFILE]

MODE ``noop``: a task that does nothing, stopped after N calls. MODE ``io``: a task that
sleeps 50 ms (blocking I/O; ``BENCH_CELERY_POOL=gevent`` patches it), stopped after N calls,
on ``BENCH_CELERY_CONCURRENCY`` workers of the pool. MODE ``retry``: a task whose
first attempt of each message calls ``self.retry(countdown=<the message's delay>)`` and
whose second attempt succeeds, stopped after N successes (the last call asks the worker for
a warm shutdown: the task returns, is acked, and the worker exits). Both write ``MARKFILE``
(and ``TIMESFILE``) as ``bench/peers/record.py`` says.

Configured at its best for this work, and like ours: ``task_acks_late=True`` (acked after the
task returns, as we ack after the receiver), one worker process with concurrency 1,
``worker_prefetch_multiplier`` = our prefetch (× concurrency 1),
``broker_transport_options={"confirm_publish": True}`` (every publish, the retry's included,
waits for the broker's confirm), results ignored, no remote control, gossip, mingle or
events, no Django fix-up (plain Python, like the Dramatiq worker), JSON. Logging at WARNING,
the ``celery worker`` default (retries are logged at INFO: not shown). The pool is
``BENCH_CELERY_POOL``: ``solo`` (the default; the task runs in the consumer's own thread, the
fastest pool for a no-op task) or ``threads`` (one thread); the benchmark runs both.
``BENCH_CELERY_LOGLEVEL`` overrides the log level (for debugging a run).

How Celery delays a message (``Task.retry``, ``celery/worker/strategy.py``): the retry is a
new task message with an ``eta`` header, published back to the *work queue*; the worker
receives it at once and *holds* it unacked in memory on a timer until the eta (raising its
channel's prefetch by one for each such message, so held messages do not block new ones),
then runs it. RabbitMQ only stores it: no head-of-line blocking, but every delayed message
sits in a worker's memory and is redelivered if that worker goes away.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

URL = os.environ.get("RMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
TASKS = {"noop": "bench_peer_noop", "retry": "bench_peer_retry", "io": "bench_peer_io"}
POOL = os.environ.get("BENCH_CELERY_POOL", "solo")
#: Pool size (``--concurrency``): 1 everywhere but the I/O-bound scenario.
CONCURRENCY = int(os.environ.get("BENCH_CELERY_CONCURRENCY", "1"))
#: Seconds of I/O per message in ``io`` mode (a sleep; gevent's pool patches it).
IO_SECONDS = 0.05


def exchange_for(queue: str) -> str:
    return f"{queue}.x"


def make_app(queue: str, prefetch: int, confirm: bool) -> Any:
    from celery import Celery
    from kombu import Exchange, Queue

    exchange = exchange_for(queue)
    # fixups=[]: no Django fix-up even though the benchmark sets DJANGO_SETTINGS_MODULE
    app = Celery("bench_peers", broker=URL, fixups=[])
    app.conf.update(
        task_queues=[Queue(queue, Exchange(exchange, type="direct"), routing_key=queue)],
        task_default_queue=queue,
        task_default_exchange=exchange,
        task_default_routing_key=queue,
        task_create_missing_queues=False,
        task_acks_late=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=prefetch,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        broker_transport_options={"confirm_publish": True} if confirm else {},
        broker_connection_retry_on_startup=True,
    )
    return app


def publish(mode: str, queue: str, items: list[tuple[int, float]]) -> None:
    """Send one task message per ``(i, delay)`` (not timed; the benchmark waits for the
    queue's depth afterwards)."""
    app = make_app(queue, 1, confirm=False)
    with app.producer_or_acquire() as producer:
        app.amqp.queues[queue](producer.channel).declare()
        for i, delay in items:
            app.send_task(TASKS[mode], args=(i, delay), queue=queue, producer=producer)
    app.close()


def main(argv: list[str]) -> int:
    mode, queue, n_text, prefetch, mark, *rest = argv
    if mode not in TASKS:
        raise SystemExit(f"unknown mode {mode!r}")
    n = int(n_text)
    if POOL == "gevent":  # what `celery worker -P gevent` does before anything else
        from gevent import monkey

        monkey.patch_all()
    from bench.peers.record import Recorder

    app = make_app(queue, int(prefetch), confirm=True)
    rec = Recorder(mark, rest[0] if rest else None)

    def stop() -> None:
        from kombu.asynchronous import get_event_loop

        rec.finish()
        os.kill(os.getpid(), signal.SIGTERM)  # warm shutdown: this task is acked first
        hub = get_event_loop()
        if hub is not None:
            # The loop may poll until its next timer (up to 10 s) before it looks at the
            # shutdown flag again: a wake-up from another thread ends that poll at once.
            threading.Thread(target=hub.call_soon, args=(lambda: None,)).start()

    @app.task(name=TASKS["noop"])
    def bench_peer_noop(i: int, delay: Any = None) -> None:
        rec.first()
        if rec.ok() == n:
            stop()

    @app.task(name=TASKS["retry"], bind=True, max_retries=3)
    def bench_peer_retry(self: Any, i: int, delay: float) -> None:
        rec.first()
        if self.request.retries == 0:
            rec.failed(i)
            raise self.retry(countdown=delay)
        if rec.ok(i) == n:
            stop()

    @app.task(name=TASKS["io"])
    def bench_peer_io(i: int, delay: Any = None) -> None:
        rec.first()
        time.sleep(IO_SECONDS)
        if rec.ok() == n:
            stop()

    try:
        app.worker_main(
            [
                "worker",
                f"--pool={POOL}",
                f"--concurrency={CONCURRENCY}",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                f"--loglevel={os.environ.get('BENCH_CELERY_LOGLEVEL', 'WARNING')}",
                f"--hostname=bench{os.getpid()}@localhost",
                "-Q",
                queue,
            ]
        )
    except SystemExit as exc:
        code = exc.code or 0
    else:
        code = 0
    if rec.count < n:
        print(f"celery worker: only {rec.count} of {n} calls", file=sys.stderr)
        return 1
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
