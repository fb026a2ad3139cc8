"""Settings of a consumer child under the quorum-native delay engine (RabbitMQ 4.3+).

The test settings with quorum queues whose retries the queues hold, and a default policy
the broker's linear backoff reproduces (1 s, then 2 s; three attempts). The test app's
``gamma`` keeps its own policy (multiplied by 1.5), which that engine cannot hold: its
check (E051) is silenced here because these children consume ``alpha`` only.
"""

from tests.settings import *  # noqa: F403
from tests.settings import RMQ_RETRY

NATIVE = {
    "DELAY_ENGINE": "quorum-native",
    "QUEUE_TYPE": "quorum",
    "RETRY": {
        "max_attempts": 3,
        "initial_delay": 1.0,
        "multiplier": 2.0,
        "max_delay": 2.0,
        "jitter": "none",
    },
}

RMQ_RETRY = {**RMQ_RETRY, **NATIVE}
SILENCED_SYSTEM_CHECKS = ["django_rmq_retry.E051"]
