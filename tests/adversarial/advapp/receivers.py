"""Three receivers whose outcome the message decides, logging every start and finish.

Every adversarial message carries a *token* (``AV<seed>N<n>Z``) in its body (or, for an empty
body, in its ``message_id``); :func:`ident` finds it however mangled the rest is, so a test
in another process counts each message exactly: from this log when handled, from the parked
row's raw body when parked.

Outcome: a JSON object body obeys ``fail`` (first N attempts, or ``"always"``), ``reject`` and
``only`` (receiver short names it applies to) and ``sleep`` (seconds); any other body fails always when its raw
bytes contain ``!FAIL`` and succeeds otherwise.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
import zlib
from typing import Any

from django_rmq_retry import Reject, Topic
from django_rmq_retry.registry import Registry, default_registry

TOKEN = re.compile(rb"AV\d+N\d+Z")

work = Topic("adv.work")  # adv_a and adv_b
other = Topic("adv.other")  # adv_g

POLICY_AB = {
    "max_attempts": 3,
    "initial_delay": 0.1,
    "multiplier": 2.0,
    "max_delay": 0.4,
    "jitter": "none",
}
POLICY_G = {**POLICY_AB, "max_attempts": 4}
MAX_ATTEMPTS = {"adv_a": 3, "adv_b": 3, "adv_g": 4}


class Boom(Exception):
    pass


def ident(message_id: Any, raw: bytes | None) -> str | None:
    """The token of an adversarial message: from its body, its gunzipped body, its message_id."""
    raw = bytes(raw or b"")
    found = TOKEN.search(raw)
    if found is None and raw[:2] == b"\x1f\x8b":
        try:
            found = TOKEN.search(gzip.decompress(raw))
        except (OSError, EOFError, zlib.error):
            found = None
    if found is None and message_id is not None:
        mid = message_id if isinstance(message_id, bytes) else str(message_id).encode()
        found = TOKEN.fullmatch(mid)
    return found.group().decode() if found else None


def _log(event: str, name: str, message: Any) -> None:
    path = os.environ.get("RMQ_TEST_LOG")
    if not path:
        return
    line = json.dumps(
        {
            "event": event,
            "receiver": name,
            "token": ident(message.message_id, message.raw),
            "attempt": message.attempt,
            "redelivered": message.redelivered,
            "requeued": message.requeued,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        if event == "done":
            os.fsync(fd)
    finally:
        os.close(fd)


def behave(name: str, message: Any) -> None:
    _log("start", name, message)
    body = message.body
    if isinstance(body, dict):
        if isinstance(body.get("sleep"), int | float) and not isinstance(body["sleep"], bool):
            time.sleep(min(float(body["sleep"]), 10.0))
        only = body.get("only")
        applies = not isinstance(only, list) or name in only
        fail = body.get("fail", 0)
        if applies and body.get("reject"):
            raise Reject(f"rejected {ident(message.message_id, message.raw)}")
        if applies and (
            fail == "always"
            or (isinstance(fail, int) and not isinstance(fail, bool) and message.attempt <= fail)
        ):
            raise Boom(f"boom attempt {message.attempt}")
    elif b"!FAIL" in bytes(message.raw or b""):
        raise Boom(f"boom (raw) attempt {message.attempt}")
    _log("done", name, message)


def adv_a(message: Any, **kwargs: Any) -> None:
    behave("adv_a", message)


def adv_b(message: Any, **kwargs: Any) -> None:
    behave("adv_b", message)


def adv_g(message: Any, **kwargs: Any) -> None:
    behave("adv_g", message)


def register(registry: Registry | None = None) -> None:
    reg = registry if registry is not None else default_registry
    reg.register(adv_a, [work], retry=POLICY_AB)
    reg.register(adv_b, [work], retry=POLICY_AB)
    reg.register(adv_g, [other], retry=POLICY_G)
