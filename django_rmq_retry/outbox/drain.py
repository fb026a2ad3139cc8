"""Draining the outbox: rounds until what is pending now is published.

:class:`Drain` orders a drain's rounds (on after a full round, back to the oldest row for rows
left waiting); :func:`publish_all` runs one. The consumer's housekeeper and ``rmq_relay`` use
the same ``Drain``.
"""

from __future__ import annotations

import time

from ..publishing.publisher import Publisher
from .relay import WAITING_PAUSE, RelayRound, publish_pending


def added(total: RelayRound, done: RelayRound) -> RelayRound:
    """``total`` and then round ``done``: counts summed, position and fullness ``done``'s."""
    return RelayRound(
        total.published + done.published,
        total.refused + done.refused,
        total.held + done.held,
        total.claimed + done.claimed,
        done.last_id,
        done.waiting,
        done.full,
    )


class Drain:
    """Where a drain's next round starts, and whether the drain is over.

    On after the last round's last row while rounds are full; then from the oldest row
    again, after a pause, if any round since the last such pass left rows waiting for
    another relay's round. A full round that left rows waiting does not go back at once
    (more rows are after it), but the drain must not end before it went back: ending there
    would leave those rows to nobody once the other relays end too (``rmq_relay --once``).
    """

    NEXT, PAUSE, DONE = "next", "pause", "done"

    def __init__(self) -> None:
        self.after: int | None = None  # the next round reads rows above this id
        self._left_waiting = False  # rows waiting since the last round from the oldest row

    def advance(self, done: RelayRound) -> str:
        """After round ``done``: ``NEXT`` at once, ``PAUSE`` first, or ``DONE``."""
        self._left_waiting = self._left_waiting or done.waiting > 0
        if done.full:
            self.after = done.last_id
            return self.NEXT
        self.after = None
        if self._left_waiting:
            self._left_waiting = False
            return self.PAUSE
        return self.DONE

    def restart(self) -> None:
        """From the oldest row (after an error: the next round reads every pending row)."""
        self.after = None
        self._left_waiting = False


def publish_all(*, using: str = "default", publisher: Publisher | None = None) -> RelayRound:
    """Rounds until what is pending now is published (rows waiting after a refusal, or
    held for an operator, stay), in the order :class:`Drain` gives. Returns the totals."""
    total = RelayRound()
    drain = Drain()
    while True:
        done = publish_pending(using=using, after=drain.after, publisher=publisher)
        total = added(total, done)
        step = drain.advance(done)
        if step == Drain.DONE:
            return total
        if step == Drain.PAUSE:
            time.sleep(WAITING_PAUSE)
