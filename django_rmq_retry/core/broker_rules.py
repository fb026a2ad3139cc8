"""What a RabbitMQ version allows and which versions are safe for us: pure rules, shared by
the system checks and ``manage.py rmq_doctor``. Standard library only.

* **Binding keys**: RabbitMQ 4.3.5 refuses a topic binding key with more than two ``#``
  wildcards (406 at ``queue.bind``); earlier versions accept it, so a key that works today
  stops a deploy after the upgrade.
* **Version floors**: 3.10 is the oldest broker we support. With quorum queues the retry
  cascade dead-letters at-least-once, and RabbitMQ's own fixes of that path landed in 4.1.0
  (mixed versions), 4.2.1 (drop-head order) and 4.2.7 (commands sent to the wrong member);
  on 4.3 they are in from 4.3.3. A quorum cascade on a 4.x below those floors can lose or
  reorder retries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: The most ``#`` wildcards RabbitMQ 4.3.5+ accepts in one topic binding key.
MAX_HASHES = 2
#: The oldest RabbitMQ we support.
OLDEST = (3, 10, 0)
#: Per 4.x series, the first release whose quorum dead-lettering we trust (see above).
QUORUM_FLOORS: dict[tuple[int, int], tuple[int, int, int]] = {
    (4, 0): (4, 2, 7),
    (4, 1): (4, 2, 7),
    (4, 2): (4, 2, 7),
    (4, 3): (4, 3, 3),
}

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")


def hashes(key: str) -> int:
    """How many words of a topic binding key are ``#``."""
    return sum(1 for word in key.split(".") if word == "#")


def too_many_hashes(keys: Iterable[str]) -> list[str]:
    """The keys RabbitMQ 4.3.5+ refuses to bind (more than :data:`MAX_HASHES` ``#``)."""
    return [key for key in keys if hashes(key) > MAX_HASHES]


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"4.3.6"`` (or ``"4.3.6-1"``, ``"4.3"``) as ``(4, 3, 6)``; ``None`` if unreadable."""
    match = _VERSION.match(text or "")
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def version_problems(version: str, queue_type: str) -> list[str]:
    """What is wrong with running on RabbitMQ ``version`` with ``queue_type`` queues, one
    line each with what to do (empty: nothing)."""
    parsed = parse_version(version)
    if parsed is None:
        return [f"RabbitMQ reports version {version!r}, which we cannot read; check it by hand"]
    if parsed < OLDEST:
        return [
            f"RabbitMQ {version} is older than {_dotted(OLDEST)}, the oldest we support: "
            "upgrade the broker"
        ]
    floor = QUORUM_FLOORS.get(parsed[:2])
    if queue_type == "quorum" and floor is not None and parsed < floor:
        return [
            f"RabbitMQ {version} with quorum queues: its at-least-once dead-lettering (the "
            f"retry cascade) lacks fixes that landed by {_dotted(floor)}: upgrade to "
            f"{_dotted(floor)} or later"
        ]
    return []
