"""The consumer: deliveries dispatched to receivers, their outcomes settled on the broker.

``engine`` (the consumer: its broker I/O on one asyncio loop), ``dispatch`` (deliveries to
the receiver threads and back), ``settle`` (outcomes applied), ``handler`` (a delivery in,
an action out; no broker), ``actions`` (the plain data between them), ``pool`` (receiver
threads), ``delivery_limit`` (a message that kills the process), ``park_writer`` (group
commit); ``loop``, the engine on blocking connections that ``engine`` replaces.
"""

import os

from .dispatch import Stats

# The consumer is the engine on one asyncio loop. Transitional, internal and undocumented:
# RMQ_RETRY_ENGINE=blocking at import selects the engine on blocking connections it
# replaces, for a comparison, until that one is deleted.
if os.environ.get("RMQ_RETRY_ENGINE") == "blocking":
    from .loop import Consumer
else:
    from .engine import LoopConsumer as Consumer  # type: ignore[assignment]

__all__ = ["Consumer", "Stats"]
