"""Waiting for a child process to reach a state: an event it causes, never a sleep.

A test that starts ``rmq_consume``, a supervisor or a relay waits for something the child
does once it is where the test needs it: the broker counts its consumer on a queue
(:func:`consuming`), a file it writes appears (:func:`file_exists`, e.g. ``--health-dir``'s
``ready``), a line shows up in its output (:func:`output_has`), or any other condition
(:func:`until`). The deadline is generous on purpose: it is not a bound on the child (a
loaded two-core host can take many seconds to start Django), only how long a test waits
before it says that something is wrong. A child that exits first fails the wait at once,
with the end of its output.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Seconds a child may take to reach a state before the test fails.
DEADLINE = 120.0


def _tail(child: Any) -> str:
    read = getattr(child, "output", None)
    return read()[-3000:] if callable(read) else "(its output is not kept)"


def until(
    what: str,
    predicate: Callable[[], object],
    *,
    child: Any = None,
    timeout: float = DEADLINE,
    interval: float = 0.1,
) -> None:
    """Return once ``predicate()`` is true; fail (naming ``what``) if ``child`` exits first
    or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if child is not None and child.poll() is not None:
            if predicate():  # it got there, then exited (a bounded run)
                return
            raise AssertionError(
                f"{what}: the child exited (code {child.poll()}) first\n{_tail(child)}"
            )
        if time.monotonic() >= deadline:
            hint = f"\n{_tail(child)}" if child is not None else ""
            raise AssertionError(f"{what}: not within {timeout:.0f}s{hint}")
        time.sleep(interval)


def consumer_count(rmq: Any, queue: str) -> int:
    """Consumers the broker counts on ``queue`` (0 while the queue does not exist)."""
    try:
        return int(rmq.consumers(queue))
    except Exception:  # not declared yet: the passive declare closed the channel (ch() reopens)
        return 0


def consuming(
    rmq: Any, queue: str, consumers: int = 1, *, child: Any = None, timeout: float = DEADLINE
) -> None:
    """Until the broker counts at least ``consumers`` consumers on ``queue``: each one's
    ``basic.consume`` is registered, so a message published now can go to any of them."""
    until(
        f"{consumers} consumer(s) on {queue}",
        lambda: consumer_count(rmq, queue) >= consumers,
        child=child,
        timeout=timeout,
    )


def file_exists(path: Path, *, child: Any = None, timeout: float = DEADLINE) -> None:
    """Until ``path`` exists (a ready file, a marker the child writes)."""
    until(f"{path} to exist", path.exists, child=child, timeout=timeout)


def output_has(child: Any, text: str, *, timeout: float = DEADLINE) -> None:
    """Until ``text`` is in ``child``'s output (a ``tests.conftest.Child``)."""
    until(
        f"{text!r} in the child's output",
        lambda: text in child.output(),
        child=child,
        timeout=timeout,
    )
