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


effects = Topic("faults.effects")


@receiver(
    effects,
    idempotent=True,
    retry={"max_attempts": 5, "initial_delay": 0.1, "multiplier": 2.0, "jitter": "none"},
)
def writes_effect(message, **kwargs):
    """One ``Effect`` row per message, in the idempotent receiver's transaction. ``fail``:
    write the row, then raise on attempts <= fail (the row must roll back with it)."""
    import os

    from tests.testapp.models import Effect

    _log("start", "writes_effect", message)
    body = message.body if isinstance(message.body, dict) else {}
    Effect.objects.create(
        receiver="writes_effect", key=str(body.get("id")), attempt=message.attempt, pid=os.getpid()
    )
    if message.attempt <= int(body.get("fail", 0)):
        raise RuntimeError(f"fail {body.get('id')} attempt {message.attempt} after its write")
    _log("done", "writes_effect", message)
