"""A publisher process for the outbox scenarios: commits one transaction that writes a marker
row and ``n`` outbox messages, then is SIGKILLed right after the commit.

``python -m tests.faults.outbox_sender BATCH FIRST N MODE`` (settings from the environment).
MODE ``before``: killed by the first ``on_commit`` callback, before the publish-on-commit ran.
MODE ``during``: killed by a timer 0-30 ms after the commit, while the publish may be running.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading

import django


def main(batch: int, first: int, n: int, mode: str) -> None:
    django.setup()
    from django.db import transaction

    from tests.testapp.events import other
    from tests.testapp.models import Effect

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def die_soon() -> None:
        threading.Timer(random.uniform(0, 0.03), die).start()

    with transaction.atomic():
        # Registered before the first outbox row, so it runs before the outbox's own callback.
        transaction.on_commit(die if mode == "before" else die_soon)
        Effect.objects.create(receiver="sender", key=f"batch-{batch}")
        for i in range(first, first + n):
            other.send({"id": i}, outbox=True)
    threading.Event().wait(5)  # "during": the timer kills us meanwhile
    sys.exit(3)  # never reached when the kill came


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
