"""Settings for the benchmarks: the demo project plus the bench-only receivers.

Everything the benchmark touches carries the per-run prefix ``RMQ_PREFIX`` (set by
``bench/run.py``), so a run never collides with the demo, the tests or another run, and its
cleanup deletes exactly its own queues and exchanges.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS, RMQ_RETRY, env

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

RMQ_RETRY = {
    **RMQ_RETRY,
    "PREFIX": env("RMQ_PREFIX", default="rmq_bench"),
    "PREFETCH": env.int("BENCH_PREFETCH", default=20),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_rmq_retry": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
