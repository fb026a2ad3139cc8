"""The consumer: a loop on the connection's thread, a handler on the worker threads.

``loop`` (connect, consume, settle, broker events), ``handler`` (a delivery in, an action
out; no broker), ``actions`` (the plain data between them), ``pool`` (receiver threads),
``delivery_limit`` (a message that kills the process), ``park_writer`` (group commit).
"""

from .loop import Consumer, Stats

__all__ = ["Consumer", "Stats"]
