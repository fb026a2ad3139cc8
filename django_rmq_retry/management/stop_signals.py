"""SIGTERM and SIGINT handlers for our long-running commands (consumer and supervisor).

A handler only records the signal or sets a flag; the loop acts on it. Signal handlers can
only be installed from the main thread: elsewhere (a consumer run inside a test's thread)
nothing is installed.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(handler: Callable[[int], None]) -> Callable[[], None]:
    """Call ``handler(signum)`` on SIGTERM/SIGINT; returns what restores the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def receive(signum: int, _frame: Any) -> None:
        handler(signum)

    old = {s: signal.signal(s, receive) for s in STOP_SIGNALS}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore
