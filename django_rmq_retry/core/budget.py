"""The give-back budget: how often one message may return to its queue unfinished.

Every way a delivery goes back to its queue (the consumer died, its connection or channel
was lost, the broker refused its retry copy, its row could not be parked, a shutdown) makes
the broker deliver it again as *redelivered*. The consumer counts those redeliveries per
message; past the limit the message is parked instead of run again, so no loop, whatever
caused it, runs a receiver more than ``limit`` times. Pure: standard library only.
"""

from __future__ import annotations

from .outcome import Park, ParkReason

#: The cause named when this process did not see why the delivery came back (another
#: consumer had it, or the process itself died).
UNSEEN_CAUSE = "the consumer died or lost its connection while handling it"


def over_budget(starts: int, limit: int, last_cause: str | None) -> Park | None:
    """``Park`` once a message was delivered ``starts`` times unfinished (``None`` below).

    ``last_cause`` is why it was last given back, when this process saw it happen: the
    parked row then says what actually looped (a refused retry copy, a lost channel).
    """
    if starts < limit:
        return None
    return Park(
        ParkReason.DELIVERY_LIMIT,
        f"given back {starts} times without finishing (limit {limit}); "
        f"last: {last_cause or UNSEEN_CAUSE}",
    )


def copy_refused(why: str) -> str:
    """The give-back cause when the broker did not store a retry copy (``why``: how)."""
    return f"the broker refused its retry copy ({why})"


def channel_lost(why: str) -> str:
    """The give-back cause of deliveries unsettled when the channel or connection went."""
    return f"the broker connection or channel was lost before it was settled ({why})"
