"""Where an ``async def`` receiver's synchronous database units run. Pure: stdlib only.

The consumer's event loop (``consumer.aio``) sets ``db_executor`` to its few database
threads for each job it runs; code inside the receiver (the ``django.tasks`` runner) hands
its own units there too. Unset (the in-memory broker, ``async_to_sync`` in a thread), a
unit runs in the calling thread, on its connection and inside its transaction.
"""

from __future__ import annotations

from concurrent.futures import Executor
from contextvars import ContextVar

db_executor: ContextVar[Executor | None] = ContextVar("rmq_retry_db_executor", default=None)
