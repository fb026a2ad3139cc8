"""The consumer: deliveries dispatched to receivers, their outcomes settled on the broker.

``engine`` (the consumer: its broker I/O on one asyncio loop), ``dispatch`` (deliveries to
the receiver threads and back), ``settle`` (outcomes applied), ``handler`` (a delivery in,
an action out; no broker), ``actions`` (the plain data between them), ``pool`` (receiver
threads), ``delivery_limit`` (a message that kills the process), ``park_writer`` (group
commit).
"""

from .dispatch import Stats
from .engine import Consumer

__all__ = ["Consumer", "Stats"]
