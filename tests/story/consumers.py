"""The receiver of the operators' how-to story: broken until someone fixes it.

``print_label`` fails with :class:`LabelPrinterDown` while the file named by the environment
variable ``RMQ_TEST_STORY_BROKEN`` exists (the switch: the test deletes the file to "fix"
the receiver, in a consumer process it cannot reach otherwise), and succeeds once it is
gone. Each start and finish is logged like the test app's receivers (``RMQ_TEST_LOG``), so
the test counts what the receiver really handled.
"""

import os

from django_rmq_retry import Topic, receiver
from tests.testapp.consumers import _log

labels = Topic("test.story.labels")


class LabelPrinterDown(Exception):
    pass


@receiver(
    labels,
    retry={
        "max_attempts": 2,
        "initial_delay": 0.1,
        "multiplier": 1.0,
        "max_delay": 0.1,
        "jitter": "none",
    },
)
def print_label(message, **kwargs):
    _log("start", "print_label", message)
    switch = os.environ.get("RMQ_TEST_STORY_BROKEN")
    if switch and os.path.exists(switch):
        raise LabelPrinterDown("the label printer is down")
    _log("done", "print_label", message)
