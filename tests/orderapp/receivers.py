"""An ordered receiver (``ordering_key="account"``) for the per-key order fault test
(``tests/faults/test_ordering_killed.py``), logging each start and finish as
``tests.testapp.consumers`` does, with the message's key, number and send time.

Body: ``account`` (the key), ``n`` (its place in the key's stream), ``sent`` (epoch seconds
at send), ``fail_first`` (the first attempt raises), ``hold_flag`` (every attempt raises
while that file exists: the message is parked after its attempts).
"""

import json
import os
import time

from django_rmq_retry import Topic, receiver

account_events = Topic("ordering.accounts")
RETRY = {"max_attempts": 3, "initial_delay": 0.3, "multiplier": 2.0, "jitter": "none"}


def _log(event, message):
    path = os.environ.get("RMQ_TEST_LOG")
    if not path:
        return
    body = message.body
    line = json.dumps(
        {
            "event": event,
            "receiver": "apply",
            "id": f"{body['account']}/{body['n']}",
            "key": body["account"],
            "n": body["n"],
            "sent": body.get("sent"),
            "attempt": message.attempt,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@receiver(account_events, ordering_key="account", retry=RETRY)
def apply(message, **kwargs):
    _log("start", message)
    body = message.body
    if body.get("fail_first") and message.attempt == 1:
        raise ConnectionError(f"{body['account']}/{body['n']}: first attempt fails")
    flag = body.get("hold_flag")
    if flag and os.path.exists(flag):
        raise ConnectionError(f"{body['account']}/{body['n']}: down while {flag} exists")
    _log("done", message)
