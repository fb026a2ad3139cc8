"""Batch after batch in one stream of confirms, each batch handed back once answered.

A requeue publishes its rows chunk by chunk and marks each chunk in the database once the
broker confirmed it. Published as one batch each, a chunk would wait for its last confirm
before the next is written: the broker idles while we build the next chunk, and we idle
while it stores the last. Here the chunks flow into one pipeline, and a chunk is handed
back as soon as each of its items has its answer, while the chunks after it are already
on the wire.

Trouble is not handled inside the stream: a nack in a finished batch ends it, and so does a
lost connection, a closed channel or a stall. The publisher then brings the batches still
in flight to an answer the careful way (one reconnect, nacks published again after
pauses) and starts a new stream for the rest (``Publisher.stream_batches``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the broker package loads pika: only when something is published
    from ..broker import Outgoing

Batch = Sequence["Outgoing"]
_END: Any = object()  # the source's end


class BatchStream:
    """The items of a source of batches, for a pipeline, and the batches in flight.

    The source yields batches, or ``None`` when it has nothing yet (its next batch is being
    loaded): the pipeline takes in confirms meanwhile. An exception the source raises ends
    the stream like its end does (``error`` keeps it): what is in flight is answered first.
    """

    def __init__(
        self,
        source: Iterator[Batch | None],
        answered: Callable[[Batch], None],
        most: int | None = None,
    ) -> None:
        self._source = source
        self._answered = answered
        self._most = most  # batches in flight at once, if bounded (their bodies are memory)
        self.pending: deque[Batch] = deque()  # published (or being published), in order
        self._scan = 0  # items of the oldest pending batch known to be answered
        self.exhausted = False
        self.error: Exception | None = None
        self.published = 0  # items handed to the pipeline by the last ``items()``

    def items(self) -> Iterator[Outgoing | None]:
        """The items to publish, batch after batch, until the source ends or a batch
        handed back would carry a nack (the careful path publishes those again)."""
        self.published = 0
        while self.hand_back():
            if self.exhausted:
                return
            if self._most is not None and len(self.pending) >= self._most:
                yield None  # wait for answers (the pipeline takes them in meanwhile)
                continue
            try:
                batch = next(self._source, _END)
            except Exception as exc:  # ends the stream; raised once the rest is answered
                self.error, self.exhausted = exc, True
                return
            if batch is _END:
                self.exhausted = True
                return
            if batch is None:
                yield None
                continue
            self.pending.append(batch)
            for item in batch:
                self.published += 1
                yield item

    def hand_back(self) -> bool:
        """Hand back the oldest batches whose items all have their answer; False when the
        oldest answered one has a nack (it stays pending)."""
        while self.pending:
            batch = self.pending[0]
            while self._scan < len(batch) and batch[self._scan].state:
                self._scan += 1
            if self._scan < len(batch):
                return True
            if any(item.nacked for item in batch):
                return False
            self.pending.popleft()
            self._scan = 0
            self._answered(batch)
        return True

    def settle(self, answer: Callable[[list[Outgoing]], None]) -> None:
        """Bring every pending batch to an answer with ``answer`` (publishes what has none
        yet or was nacked, the careful way), handing each back in order. If ``answer``
        raises, the rest are handed back as they are (items without an answer keep state
        ``""``) before it propagates: what the broker did confirm is never forgotten."""
        try:
            while self.pending:
                batch = self.pending[0]
                todo = [item for item in batch if not item.state or item.nacked]
                if todo:
                    answer(todo)
                self.pending.popleft()
                self._scan = 0
                self._answered(batch)
        finally:
            while self.pending:
                self._answered(self.pending.popleft())
            self._scan = 0


__all__ = ["Batch", "BatchStream"]
