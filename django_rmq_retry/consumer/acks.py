"""Which ack and nack frames settle a channel's deliveries: pure, no I/O.

A consume channel numbers its deliveries 1, 2, 3, ... and settles each one once, in any
order: receivers finish out of order, a retry copy's original waits for the copy's confirm,
a parked row for its commit. One ``basic.ack`` with ``multiple=True`` settles *every*
delivery of the channel up to its tag, so it may only go out when none of those is still
open (running, waiting, or never dispatched at all: a bounded run or a warm stop leaves
those for the broker to redeliver). :class:`AckBook` keeps that account for one channel and
turns what settled since the last :meth:`AckBook.flush` into the fewest frames that are safe:

1. a nack per delivery given back or dropped, **first**: a multiple ack sent before it
   would already have settled that tag, and the nack of a tag the broker no longer knows
   is a channel error (406, unknown delivery tag) that closes the channel and gives every
   other delivery on it back;
2. one ack (``multiple=True`` when it settles more than one) for the run of acked
   deliveries at the head, the oldest ones still unsettled;
3. a single ack per acked delivery behind a delivery still open (a multiple ack would
   cover the open one).

A book belongs to one channel: delivery tags start over on a new channel, so a new channel
gets a new book, and a tag of a closed channel is never answered on its successor.

A tag the broker *took back* without closing the channel (RabbitMQ 4.3's quorum consumer
timeout: it cancels the consumer and delivers the message again, on the same channel) is
never answered: an ack of it is accepted silently and puts the cancelled consumer back to
work, so the broker sends it deliveries no callback receives, stuck until they time out
too. :meth:`AckBook.stand_in` names the delivery that stands in for it: what settles the
taken-back tag settles the stand-in, and the taken-back tag stays open (never covered by
a multiple ack) for as long as the channel lives.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

OPEN, ACK, REQUEUE, DROP, TAKEN_BACK, REJECT = 0, 1, 2, 3, 4, 5
#: Settled, its frame not sent yet.
SETTLED = (ACK, REQUEUE, DROP, REJECT)
#: Where a taken-back delivery's stand-in is awaited (``AckBook.await_stand_in``).
AWAITED = -1


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame to send: ``basic.ack(tag, multiple)``, ``basic.nack(tag, requeue)`` or
    (``reject``) ``basic.reject(tag, requeue=True)``."""

    tag: int
    nack: bool = False
    multiple: bool = False
    requeue: bool = True
    reject: bool = False


class AckBook:
    """The open and settled deliveries of one consume channel (see the module docstring).

    Call :meth:`delivered` for every delivery as it arrives (in the channel's order), then
    :meth:`ack` or :meth:`nack` once it settles, and send what :meth:`flush` returns.
    """

    __slots__ = ("_awaited", "_instead", "_order", "_settled", "_state")

    def __init__(self) -> None:
        #: Every delivery not answered yet (open, or settled since the last flush).
        self._state: dict[int, int] = {}
        #: Tags in delivery order; may still hold tags answered already (skipped lazily).
        self._order: deque[int] = deque()
        #: Tags settled since the last flush, in the order they settled.
        self._settled: list[int] = []
        #: A taken-back tag -> the delivery that settles in its place (``stand_in``), or
        #: AWAITED while that one is on its way.
        self._instead: dict[int, int] = {}
        #: A taken-back tag whose stand-in is awaited -> its settlement (AWAITED: none yet).
        self._awaited: dict[int, int] = {}

    def __len__(self) -> int:
        """Deliveries not answered yet: open ones and those settled since the last flush."""
        return len(self._state)

    @property
    def pending(self) -> bool:
        """Whether a :meth:`flush` now would return frames."""
        return bool(self._settled)

    def delivered(self, tag: int) -> None:
        """A delivery arrived: open until it settles, never covered by a multiple ack."""
        if tag in self._state:
            return
        self._state[tag] = OPEN
        self._order.append(tag)

    def ack(self, tag: int) -> bool:
        """Settle ``tag`` with an ack; False (and nothing to send) for a tag this book does
        not hold open: answered already, or never delivered on this channel."""
        return self._settle(tag, ACK)

    def nack(self, tag: int, *, requeue: bool = True) -> bool:
        """Settle ``tag`` with a nack: back to its queue (``requeue``), or dropped (the
        queue's dead-lettering applies). False as for :meth:`ack`."""
        return self._settle(tag, REQUEUE if requeue else DROP)

    def reject(self, tag: int) -> bool:
        """Settle ``tag`` with ``basic.reject(requeue=True)``: back to its queue, counted by
        a quorum queue (whose delayed retry then holds it). False as for :meth:`ack`."""
        return self._settle(tag, REJECT)

    def stand_in(self, taken_back: int, live: int) -> None:
        """The broker took ``taken_back`` back and delivered its message again as ``live``
        (see the module docstring): settling ``taken_back`` settles ``live`` from now on,
        and ``taken_back`` (like a stand-in it replaced) is never answered. If the one it
        replaces is settled already and its frame not sent yet, or ``taken_back`` settled
        while its stand-in was awaited (:meth:`await_stand_in`), ``live`` takes that
        settlement over now."""
        if self._state.get(live) != OPEN:
            return
        outcome = self._awaited.pop(taken_back, None)
        holder = self._instead.get(taken_back, taken_back)
        if outcome is None and self._state.get(holder) in SETTLED:
            outcome = self._state[holder]
            self._settled.remove(holder)
        for tag in (taken_back, holder):
            if tag >= 0 and self._state.get(tag) in (OPEN, *SETTLED):
                self._state[tag] = TAKEN_BACK
        if outcome is not None and outcome != AWAITED:
            self._instead.pop(taken_back, None)
            self._state[live] = outcome
            self._settled.append(live)
            return
        self._instead[taken_back] = live

    def await_stand_in(self, taken_back: int) -> None:
        """The broker probably took back the delivery that settles ``taken_back`` (its
        consumer was cancelled while it waited) and will deliver it again: nothing answers
        it from now on; a settlement of ``taken_back`` waits for :meth:`stand_in`."""
        holder = self._instead.get(taken_back, taken_back)
        if holder < 0:
            return  # awaited already
        outcome = self._state.get(holder)
        if outcome in SETTLED:
            self._settled.remove(holder)
            self._awaited[taken_back] = outcome
        elif outcome != OPEN:
            return  # answered already: nothing to await
        else:
            self._awaited[taken_back] = AWAITED
        self._state[holder] = TAKEN_BACK
        if self._state.get(taken_back) == OPEN:
            self._state[taken_back] = TAKEN_BACK
        self._instead[taken_back] = AWAITED

    def holds(self, tag: int) -> bool:
        """Whether ``tag``'s answer is still to be sent (open, settled since the last
        flush, or taken back: never)."""
        return tag in self._state

    def take_back(self, tag: int) -> None:
        """The broker took ``tag`` back and its stand-in (if any) settles on its own:
        settling ``tag`` sends nothing, ever."""
        self._instead.pop(tag, None)
        self._awaited.pop(tag, None)
        if self._state.get(tag) == OPEN:
            self._state[tag] = TAKEN_BACK

    def _settle(self, tag: int, outcome: int) -> bool:
        target = self._instead.pop(tag, tag)
        if target == AWAITED:  # its stand-in is on its way: settled when it arrives
            if self._awaited.get(tag) != AWAITED:
                return False
            self._awaited[tag] = outcome
            return True
        tag = target
        if self._state.get(tag) != OPEN:
            return False
        self._state[tag] = outcome
        self._settled.append(tag)
        return True

    def flush(self) -> list[Frame]:
        """The frames that answer every delivery settled since the last flush, in the order
        to send them; the book forgets those deliveries."""
        if not self._settled:
            return []
        state = self._state
        frames: list[Frame] = []
        for tag in self._settled:
            outcome = state[tag]
            if outcome in (REQUEUE, DROP, REJECT):
                frames.append(
                    Frame(tag, nack=True, requeue=outcome != DROP, reject=outcome == REJECT)
                )
                del state[tag]
        order = self._order
        head: int | None = None
        run = 0
        while order:
            tag = order[0]
            now = state.get(tag)
            if now is None:  # answered already (a nack above, a single ack before)
                order.popleft()
            elif now == ACK:
                order.popleft()
                del state[tag]
                head = tag
                run += 1
            else:  # the oldest delivery still open: no multiple ack reaches past it
                break
        if head is not None:
            frames.append(Frame(head, multiple=run > 1))
        for tag in self._settled:
            if state.get(tag) == ACK:
                frames.append(Frame(tag))
                del state[tag]
        self._settled = []
        if len(order) > 2 * len(state) + 64:
            # Answered tags pile up behind one that stays open (a row held for hours):
            # keep the order of the open ones only (the dict keeps insertion order).
            self._order = deque(state)
        return frames
