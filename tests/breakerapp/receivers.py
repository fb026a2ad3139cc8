"""A receiver that calls a dependency ("payments": down while the file named by
``RMQ_TEST_DOWN_FLAG`` exists) and one that calls nothing: the outage test's children run
them (``tests/faults/breaker_settings.py``), logging each start and finish as
``tests.testapp.consumers`` does."""

import os

from django_rmq_retry import Topic, receiver
from tests.testapp.consumers import _log

charge_topic = Topic("breakers.charge")
notify_topic = Topic("breakers.notify")
RETRY = {"max_attempts": 3, "initial_delay": 0.2, "multiplier": 2.0, "jitter": "none"}


@receiver(charge_topic, depends_on="payments", retry=RETRY)
def charge(message, **kwargs):
    _log("start", "charge", message)
    flag = os.environ.get("RMQ_TEST_DOWN_FLAG")
    if flag and os.path.exists(flag):
        raise ConnectionError("payments is down")
    _log("done", "charge", message)


@receiver(notify_topic, retry=RETRY)
def notify(message, **kwargs):
    _log("start", "notify", message)
    _log("done", "notify", message)
