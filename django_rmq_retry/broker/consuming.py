"""A consume channel on a link (``links.Link``): the event-loop twin of
``connection.Channel``.

Nothing here waits: ``qos``, ``consume``, ``cancel``, ``ack`` and ``nack`` (inherited from
``connection.Consuming``) write their frame and return (pika sends the RPCs among them one
after another, in the order they were called); deliveries and the broker's ``basic.cancel``
arrive as callbacks on the link's loop. Declaring the topology is not here: it stays on a short-lived blocking connection
(``connection.Channel.declare``) that its caller runs in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .connection import Consuming
from .links import Link
from .translate import describe, translated


class ConsumeChannel(Consuming):
    """One channel of a link that consumes and settles. ``close_reason`` says why it
    closed ("" while open)."""

    def __init__(self, raw: Any) -> None:
        super().__init__(raw)
        self.close_reason = ""

    @classmethod
    def open(
        cls,
        link: Link,
        on_open: Callable[[ConsumeChannel], None],
        on_close: Callable[[str], None],
    ) -> ConsumeChannel:
        """Open a channel on ``link``: ``on_open(channel)`` once it is open, ``on_close(why)``
        once it closed (the broker closed it, e.g. a 406 acknowledgement timeout; we did; or
        its connection went)."""
        channel: ConsumeChannel | None = None

        def opened(_raw: Any) -> None:
            assert channel is not None
            on_open(channel)

        def closed(_raw: Any, reason: BaseException) -> None:
            assert channel is not None
            channel.close_reason = describe(reason)
            on_close(channel.close_reason)

        with translated():  # a link closed meanwhile: ConnectionLost
            channel = cls(link.channel(opened, closed))
        return channel


__all__ = ["ConsumeChannel"]
