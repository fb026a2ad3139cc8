"""Bench-only receivers. Each one does the least its scenario needs.

``BENCH_MARK_FILE`` (when set) receives one line per process, written by the first call:
``<epoch seconds> <pid>``; the benchmark times from the first delivery to the consumer's
exit, so interpreter and Django start-up are not counted (the raw pika twins do the same).
``bench_noop`` also writes ``end <epoch seconds> <pid> <calls>`` at exit: the happy path is
timed from the first to the last call, so a consumer that stops on ``--max-idle-time``
(two processes) is measured like one that stops on ``--max-messages``.
"""

import asyncio
import atexit
import json
import os
import threading
import time

from bench.cpuwork import ROUNDS, burn
from django_rmq_retry import Reject, Retry, Topic, receiver

noop_topic = Topic("bench.noop")
cpu_topic = Topic("bench.cpu")
pub_topic = Topic("bench.pub")
retry_topic = Topic("bench.retry")
delay_topic = Topic("bench.delay")
park_topic = Topic("bench.park")
requeue_topic = Topic("bench.requeue")
io_topic = Topic("bench.io")
aio_topic = Topic("bench.aio")
ordered_topic = Topic("bench.ordered")

#: Seconds of I/O one message of the I/O-bound scenario waits for.
IO_SECONDS = 0.05

_marked = False
_calls = 0
_last = 0.0


def mark_first() -> None:
    global _marked
    if _marked:
        return
    _marked = True
    path = os.environ.get("BENCH_MARK_FILE")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{time.time()} {os.getpid()}\n")
        atexit.register(_mark_end, path)


def _mark_end(path: str) -> None:
    if _calls:
        with open(path, "a") as fh:
            fh.write(f"end {_last} {os.getpid()} {_calls}\n")


_count_lock = threading.Lock()


def _count_call() -> None:
    global _calls, _last
    with _count_lock:  # several receiver threads in the I/O-bound scenario
        _calls += 1
        _last = time.time()


@receiver(noop_topic)
def bench_noop(message, **kwargs):
    """Does nothing; remembers when it was last called (written at exit as ``end ...``)."""
    mark_first()
    _count_call()


@receiver(ordered_topic, ordering_key="i")
def bench_ordered(message, **kwargs):
    """``bench_noop`` with per-key order (every message its own key: none is held)."""
    mark_first()
    _count_call()


@receiver(cpu_topic)
def bench_cpu(message, **kwargs):
    """About 0.5 ms of pure-Python CPU per message (the process-scaling benchmark), or
    the body's ``burn`` rounds (the observability scenario's ~1 ms receiver)."""
    mark_first()
    body = message.body if isinstance(message.body, dict) else {}
    burn(int(body.get("burn") or 0) or ROUNDS)
    _count_call()


@receiver(io_topic)
def bench_io(message, **kwargs):
    """50 ms of blocking I/O (a sleep) per message: the I/O-bound scenario's threads."""
    mark_first()
    time.sleep(IO_SECONDS)
    _count_call()


@receiver(aio_topic)
async def bench_aio(message, **kwargs):
    """50 ms of awaited I/O per message: the I/O-bound scenario's event loop."""
    mark_first()
    await asyncio.sleep(IO_SECONDS)
    _count_call()


@receiver(pub_topic)
def bench_pub(message, **kwargs):
    """Only here so ``bench.pub`` has a queue; never consumed by the benchmark."""


@receiver(
    retry_topic,
    retry={
        "max_attempts": 3,
        "initial_delay": 600.0,
        "multiplier": 1.0,
        "max_delay": 600.0,
        "jitter": "none",
    },
)
def bench_retry(message, **kwargs):
    """Fails the first attempt; the retry copy waits 10 minutes (the run ends before).
    A body with ``"count": 1`` (the observability scenario) is timed to the last call,
    like ``bench_noop``, rather than to the consumer's exit."""
    mark_first()
    if isinstance(message.body, dict) and message.body.get("count"):
        _count_call()
    if message.attempt == 1:
        raise RuntimeError("first attempt fails")


@receiver(delay_topic, retry={"max_attempts": 3, "initial_delay": 1.0, "jitter": "none"})
def bench_delay(message, **kwargs):
    """Attempt 1 asks for ``body['delay']`` seconds; attempt 2 records how late it came."""
    mark_first()
    if message.attempt == 1:
        raise Retry(delay=float(message.body["delay"]))
    now_ms = time.time() * 1000
    prefix = os.environ.get("RMQ_PREFIX", "rmq_bench")
    due = message.headers.get(f"{prefix}-due")
    due_us = message.headers.get(f"{prefix}-due-us")
    if isinstance(due_us, int):  # the due time to the µs (the ms header is rounded up)
        due = due_us / 1000
    path = os.environ.get("BENCH_DELAY_FILE")
    if path:
        line = json.dumps(
            {
                "i": message.body.get("i"),
                "delay": message.body["delay"],
                "due": due,
                "arrived": now_ms,
            }
        )
        with open(path, "a") as fh:
            fh.write(line + "\n")


@receiver(park_topic)
def bench_park(message, **kwargs):
    mark_first()
    raise Reject("bench: park at once")


@receiver(requeue_topic)
def bench_requeue(message, **kwargs):
    """Target queue of the requeue benchmark; never consumed by the benchmark."""


# The peers group (bench/peers, issue #14) ---------------------------------------------
peer_retry_topic = Topic("bench.peerretry")
_peer_recorder = None


def _peer_record():
    """The peers group's bookkeeping (``bench/peers/record.py``): ``BENCH_MARK_FILE`` and
    ``BENCH_TIMES_FILE``, written at exit."""
    global _peer_recorder
    if _peer_recorder is None:
        from bench.peers.record import Recorder

        _peer_recorder = Recorder(
            os.environ.get("BENCH_MARK_FILE"), os.environ.get("BENCH_TIMES_FILE")
        )
        atexit.register(_peer_recorder.finish)
    return _peer_recorder


@receiver(
    peer_retry_topic,
    retry={
        "max_attempts": 3,
        "initial_delay": 1.0,
        "multiplier": 1.0,
        "max_delay": 60.0,
        "jitter": "none",
    },
)
def bench_peer_retry(message, **kwargs):
    """Attempt 1 asks for a retry after ``body['delay']`` seconds; attempt 2 succeeds. The
    time of each is recorded: the peers group compares the lateness of the retries and the
    completion time with Dramatiq's, Celery's and the raw twin's."""
    rec = _peer_record()
    rec.first()
    i = message.body["i"]
    if message.attempt == 1:
        rec.failed(i)
        raise Retry(delay=float(message.body["delay"]))
    rec.ok(i)
