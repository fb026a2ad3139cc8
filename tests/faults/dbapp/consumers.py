from django.contrib.auth.models import User

from django_rmq_retry import Topic, receiver
from tests.testapp.consumers import _log

needs_db = Topic("faults.needs-db")


@receiver(
    needs_db,
    retry={
        "max_attempts": 30,
        "initial_delay": 0.5,
        "multiplier": 2.0,
        "max_delay": 2.0,
        "jitter": "none",
    },
)
def uses_db(message, **kwargs):
    """Fails with the database's own error while it is down; the consumer must retry."""
    _log("start", "uses_db", message)
    User.objects.count()
    _log("done", "uses_db", message)
