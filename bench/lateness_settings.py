"""Settings of the lateness scenario (``bench/lateness.py``): the bench settings with quorum
queues, the delay engine ``BENCH_LATENESS_ENGINE`` names, and ``bench.latenessapp``.

The bench app's other receivers keep policies the quorum-native engine cannot hold (check
E051): silenced here, since the scenario's consumer reads ``bench_lateness`` only.
"""

from bench.settings import *  # noqa: F403
from bench.settings import INSTALLED_APPS, RMQ_RETRY, env

INSTALLED_APPS = [*INSTALLED_APPS, "bench.latenessapp"]
RMQ_RETRY = {
    **RMQ_RETRY,
    "QUEUE_TYPE": "quorum",
    "DELAY_ENGINE": env("BENCH_LATENESS_ENGINE", default="cascade"),
}
SILENCED_SYSTEM_CHECKS = ["django_rmq_retry.E051"]
