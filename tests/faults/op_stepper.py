"""A process that steps one background requeue operation and dies at the worst moment.

``python tests/faults/op_stepper.py OP_ID WHEN`` (the test's environment: settings,
database, broker prefix) takes the operation's lease and steps it, then exits with
``os._exit(9)`` (no ``finally`` runs: the lease and the claims stay as they were):

* ``confirmed``: once the broker confirmed the step's first batch, before the requeue marks
  a row or the step counts a copy;
* ``fenced``: after the step fenced its batch, before anything is published.

``freeze`` stops itself instead (``SIGSTOP``) once the first batch is confirmed; after the
test's ``SIGCONT`` the step goes on as a woken process would, and the script exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import django

django.setup()

from django_rmq_retry.parking import operations, requeuing  # noqa: E402

real = requeuing.get_publisher
WHEN = sys.argv[2]


class Dying:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def stream_batches(self, batches: Any, answered: Any, **kwargs: Any) -> Any:
        def die(batch: Any) -> None:
            if WHEN == "freeze":
                print("confirmed; freezing before the marks", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
                answered(batch)  # woken: the marks, as the step would have made them
                return
            print("confirmed; dying before the marks", flush=True)
            os._exit(9)

        if WHEN == "fenced":
            print("fenced; dying before the publish", flush=True)
            os._exit(9)
        return self.inner.stream_batches(batches, die, **kwargs)


requeuing.get_publisher = lambda *a, **k: Dying(real(*a, **k))  # type: ignore[assignment]
operations.advance(int(sys.argv[1]), owner="stepper")
# Frozen: the step ended. Otherwise it ended without publishing: the scenario did not happen.
sys.exit(0 if WHEN == "freeze" else 3)
