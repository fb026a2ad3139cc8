"""The receiver of the lateness scenario (``bench/lateness.py``): attempt 1 fails, attempt 2
succeeds, each writing one line ``fail|ok <i> <epoch seconds>`` to ``BENCH_LATENESS_LOG``.

Its policy (one retry after ``BENCH_LATENESS_DELAY`` seconds, no jitter) is a fixed delay,
which both delay engines hold exactly: the cascade's delay levels and a quorum queue's own
delayed retry.
"""

import os
import time

from django_rmq_retry import Topic, receiver

DELAY = float(os.environ.get("BENCH_LATENESS_DELAY", "10"))
lateness_topic = Topic("bench.lateness")


class Due(Exception):
    """Attempt 1's failure: the retry it asks for is what the scenario measures."""


def _write(line: str) -> None:
    path = os.environ.get("BENCH_LATENESS_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@receiver(
    lateness_topic,
    retry={
        "max_attempts": 2,
        "initial_delay": DELAY,
        "multiplier": 1.0,
        "max_delay": DELAY,
        "jitter": "none",
    },
)
def bench_lateness(message, **kwargs):
    now = time.time()
    if message.attempt == 1:
        _write(f"fail {message.body['i']} {now:.6f}")
        raise Due("due later")
    _write(f"ok {message.body['i']} {now:.6f}")
