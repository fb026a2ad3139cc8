"""Receivers whose behaviour the message body dictates, logging every start and finish.

Body keys (all optional): ``id``; ``fail``: fail the first N attempts (``"always"`` for every
attempt); ``only``: list of receiver short names that should fail (others succeed);
``sleep``: seconds to sleep; ``exit``: ``os._exit`` on attempts <= this number (process death);
``reject``: raise Reject; ``retry_delay``: raise Retry(delay=...) instead of an error.

Each start/finish is one JSON line appended to the file named by ``RMQ_TEST_LOG`` (when set),
so a test in another process — or one that SIGKILLs the consumer — can count exactly.
"""

import json
import os
import time

from django_rmq_retry import Reject, Retry, receiver
from django_rmq_retry.signals import message_retried

from .events import other, work


class Boom(Exception):
    pass


def _log(event, name, message):
    path = os.environ.get("RMQ_TEST_LOG")
    if not path:
        return
    body = message.body if isinstance(message.body, dict) else {}
    line = json.dumps(
        {
            "event": event,
            "receiver": name,
            "id": body.get("id"),
            "attempt": message.attempt,
            "redelivered": message.redelivered,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd) if event == "done" else None
    finally:
        os.close(fd)


def behave(name, message):
    _log("start", name, message)
    body = message.body if isinstance(message.body, dict) else {}
    only = body.get("only")
    applies = only is None or name in only
    if applies and body.get("sleep"):
        time.sleep(float(body["sleep"]))
    if (
        applies
        and body.get("exit")
        and message.attempt <= int(body["exit"])
        and os.environ.get("RMQ_TEST_ALLOW_EXIT")
    ):
        os._exit(42)
    if applies and body.get("reject"):
        raise Reject(f"rejected {body.get('id')}")
    fail = body.get("fail", 0)
    if applies and (fail == "always" or (isinstance(fail, int) and message.attempt <= fail)):
        if body.get("retry_delay") is not None:
            raise Retry(delay=float(body["retry_delay"]))
        raise Boom(f"boom {body.get('id')} attempt {message.attempt}")
    _log("done", name, message)


@receiver(work)
def alpha(message, **kwargs):
    behave("alpha", message)


@receiver(work)
def beta(message, **kwargs):
    behave("beta", message)


@receiver(
    other,
    retry={
        "max_attempts": 10,
        "initial_delay": 0.1,
        "multiplier": 1.5,
        "max_delay": 0.5,
        "jitter": "none",
    },
)
def gamma(message, **kwargs):
    behave("gamma", message)


def _slow_alert(sender, message, **kwargs):
    """A slow ``message_retried`` hook (an alert posted to a slow service), when asked for:
    it takes ``RMQ_TEST_SLOW_RETRY_SIGNAL`` seconds, or less if the file named by
    ``RMQ_TEST_SLOW_RETRY_RELEASE`` appears first (the test says when it has seen enough)."""
    seconds = float(os.environ.get("RMQ_TEST_SLOW_RETRY_SIGNAL") or 0)
    if seconds:
        _log("signal-start", str(sender).rsplit(".", 1)[-1], message)
        release = os.environ.get("RMQ_TEST_SLOW_RETRY_RELEASE")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (release and os.path.exists(release)):
            time.sleep(0.05)
        _log("signal-end", str(sender).rsplit(".", 1)[-1], message)


message_retried.connect(_slow_alert, weak=False, dispatch_uid="tests-slow-alert")


if os.environ.get("RMQ_TEST_ASYNC"):  # a consumer child of the async tests
    from . import async_consumers  # noqa: F401
