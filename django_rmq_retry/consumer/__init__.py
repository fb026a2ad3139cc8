"""The consumer: deliveries dispatched to receivers, their outcomes settled on the broker.

``dispatch`` (deliveries to the receiver threads and back), ``settle`` (outcomes applied),
``loop`` (the engine on blocking connections), ``engine`` (the engine on one asyncio
loop), ``handler`` (a delivery in, an action out; no broker), ``actions`` (the plain data
between them), ``pool`` (receiver threads), ``delivery_limit`` (a message that kills the
process), ``park_writer`` (group commit).
"""

import os

from .dispatch import Stats

# Transitional, internal: RMQ_RETRY_ENGINE=loop at import selects the engine on one asyncio
# loop while it is proven against the suites; the blocking engine stays the default.
if os.environ.get("RMQ_RETRY_ENGINE") == "loop":
    from .engine import LoopConsumer as Consumer
else:
    from .loop import Consumer  # type: ignore[assignment]

__all__ = ["Consumer", "Stats"]
