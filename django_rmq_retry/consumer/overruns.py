"""A delivery never runs while an earlier run of the same message still goes on.

RabbitMQ 4.3 takes a message back from a quorum queue's consumer that holds it longer than
the queue's *consumer timeout* (``x-consumer-timeout``, policy ``consumer-timeout``; 30
minutes by default): it sends that consumer a ``basic.cancel``, keeps the channel open, and
delivers the message again, often to the consumer this process starts in its place. Handed
to a receiver, that delivery would run beside the slow run still going, again at every
timeout, and no run's end would settle it (the delivery-limit row of each is forgotten when
the other settles). Earlier versions closed the channel instead (406), which took every
delivery of the channel back at once.

:class:`Overruns` tracks the message of every delivery the consumer admitted (by the
delivery limit's identity: queue, message id, body, attempt) until its run ended and its
outcome's frame is sent (the broker may take it back in between: a retry copy waiting for
its confirm, a row for its commit, an ack for the next flush), and says what to do with
another delivery of it that arrives meanwhile (:meth:`Overruns.arrived`):

* the broker took the running one back (its consumer was cancelled, the new one is
  redelivered, on the same channel): the new delivery **stands in** for it. It never runs;
  the run's outcome settles it (``AckBook.stand_in``), and the taken-back tag is never
  answered (an ack of it puts the cancelled consumer back to work).
* after ``limit`` such take-backs while one run still goes on, the stand-in is **parked**
  (reason *delivery_limit*, the detail names the consumer timeout): a receiver that hangs
  ends in front of an operator, not in a loop of timeouts. The run's outcome, when it
  comes, is dropped (its message is parked already).
* any other overlap (the same message published twice, a redelivery after a lost
  connection while the old run goes on): the new delivery **waits** and runs once the
  earlier run has ended (after its end, it runs at once).

:class:`Cancels` is the part of ``dispatch.Dispatcher`` that applies it: the broker's
``basic.cancel`` (remembered per consumer tag, then resumed by the engine's tick),
admitting a delivery, and a run's end. Pure bookkeeping: no pika, no database.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ..core.envelope import read_incoming
from ..core.names import Names
from ..core.outcome import Park, ParkReason
from .acks import AckBook
from .actions import HANDLED, Delivery, StorePark
from .delivery_limit import DeliveryLimit
from .handler import Handler
from .pool import CANCELLED, Job

logger = logging.getLogger("django_rmq_retry.consumer")

RUN, WAIT, STAND_IN = "run", "wait", "stand-in"
#: Ended runs looked at per arrival, to forget those whose outcome is answered: more than
#: one, so they are forgotten faster than arrivals can end runs.
FORGET_PER_ARRIVAL = 4

#: The give-back cause named when a message overran its queue's consumer timeout.
OVERRAN = "it overran its queue's consumer timeout (RabbitMQ took it back and delivered it again)"


def overran_detail(times: int) -> str:
    """The parked row's detail for a message taken back ``times`` times while one run of
    it went on."""
    return (
        f"its receiver was still running after RabbitMQ took it back {times} times (the "
        "queue's consumer timeout, x-consumer-timeout); parked while that run goes on. "
        "Make the receiver faster or raise the queue's consumer timeout"
    )


@dataclass
class _Run:
    """One message's run in progress, and what arrived for it meanwhile."""

    job: Job
    consumer: str  # the consumer tag that delivered ``job``'s delivery
    generation: int
    live: Job | None = None  # the redelivery standing in for the taken-back delivery
    live_consumer: str = ""
    taken_back: int = 0  # how often the broker took it back while the run went on
    waiting: list[Job] = field(default_factory=list)
    superseded: bool = False  # its message is parked: the run's outcome is dropped
    done: bool = False  # the run ended; kept until its outcome's frame is sent

    def live_tag(self) -> int:
        """The tag its outcome will settle: its stand-in's, else its own."""
        return (self.live or self.job).delivery.tag


class Overruns:
    """Every admitted message until its run ends (see the module docstring). Any thread."""

    def __init__(
        self, identity: Callable[[Delivery], Hashable], limit: int, *, timeouts: bool = True
    ) -> None:
        self._identity = identity
        #: Whether a cancel may be a consumer timeout (quorum queues, RabbitMQ 4.3): else
        #: a cancel (queue deleted, node gone) takes nothing back that is delivered again.
        self.timeouts = timeouts
        self.limit = max(1, int(limit))
        self._lock = threading.Lock()
        self._runs: dict[Hashable, _Run] = {}
        #: Identities whose run ended, oldest first, until their outcome's frame is sent.
        self._ended: OrderedDict[Hashable, None] = OrderedDict()
        self._keys: dict[int, Hashable] = {}  # id(job) of a run -> its identity
        self._cancelled: set[str] = set()  # consumer tags the broker cancelled (this channel)
        self._generation = 0

    def new_channel(self, generation: int) -> None:
        """A new consume channel: tags of the old one mean nothing on it. Runs of the old
        one still going stay tracked (their redeliveries wait for them)."""
        with self._lock:
            self._generation = generation
            self._cancelled.clear()
            for key, run in list(self._runs.items()):
                # A job cancelled never ran and never will; an ended run's outcome was
                # for the old channel, which took its unanswered deliveries back.
                if run.job.state is CANCELLED or run.done:
                    del self._runs[key]
                    self._keys.pop(id(run.job), None)
                    self._ended.pop(key, None)
                    continue
                run.live, run.live_consumer = None, ""
                run.waiting = [j for j in run.waiting if j.delivery.generation == generation]

    def cancelled(self, consumer_tag: str, book: AckBook) -> None:
        """The broker cancelled this consumer (``basic.cancel``; the loop's thread). A
        delivery it handed us that stands for a run (the run's own, or its stand-in) and
        waits unanswered is the one the consumer timeout took back (held longer than any
        other), and is delivered again: from now on the run's outcome waits for that
        redelivery (``AckBook.await_stand_in``). Answering the old tag would put the
        cancelled consumer back to work (module docstring of ``acks``)."""
        with self._lock:
            self._cancelled.add(consumer_tag)
            if not self.timeouts:
                return
            for run in self._runs.values():
                holder_consumer = run.live_consumer if run.live is not None else run.consumer
                if (
                    holder_consumer == consumer_tag
                    and not run.superseded
                    and run.generation == self._generation
                    and run.job.state is not CANCELLED
                ):
                    book.await_stand_in(run.job.delivery.tag)

    def arrived(self, job: Job, consumer_tag: str, book: AckBook) -> str | int:
        """A delivery arrived (the loop's thread): ``RUN`` it, let it ``WAIT`` for the run of
        its message to end, or it is the ``STAND_IN`` of a taken-back delivery (settled
        through ``book``). An ``int``: park it, its message taken back that many times."""
        d = job.delivery
        key = self._identity(d)
        with self._lock:
            self._forget_answered(book)
            run = self._runs.get(key)
            holder = run.live if run is not None and run.live is not None else None
            holder_consumer = (
                (run.live_consumer if holder is not None else run.consumer) if run else ""
            )
            taken_back = (
                run is not None
                and not run.superseded
                and d.redelivered
                and run.generation == d.generation == self._generation
                and holder_consumer in self._cancelled
            )
            if run is None or run.job.state is CANCELLED or (run.done and not taken_back):
                # Nothing of it runs (a cancelled job never ran; an ended run's outcome
                # is answered, or this is not the broker taking it back): run it.
                if run is not None:
                    self._keys.pop(id(run.job), None)
                    self._ended.pop(key, None)
                self._runs[key] = _Run(job, consumer_tag, d.generation)
                self._keys[id(job)] = key
                return RUN
            assert run is not None
            if not taken_back:
                run.waiting.append(job)
                return WAIT
            if run.done:  # ended, its outcome's frame not sent: that frame goes to this one
                book.stand_in(run.job.delivery.tag, d.tag)
                run.live, run.live_consumer = job, consumer_tag
                return STAND_IN
            holder = holder or run.job
            run.taken_back += 1
            if run.taken_back >= self.limit:
                run.superseded = True
                book.take_back(run.job.delivery.tag)
                book.take_back(holder.delivery.tag)
                run.live, run.live_consumer = None, ""
                return run.taken_back
            book.stand_in(run.job.delivery.tag, d.tag)
            run.live, run.live_consumer = job, consumer_tag
            return STAND_IN

    def ended(self, job: Job) -> tuple[list[Job], bool]:
        """``job``'s run ended (any thread): the deliveries that waited for it (to run
        now), and whether its outcome is to be dropped (its message was parked)."""
        with self._lock:
            key = self._keys.get(id(job))
            run = self._runs.get(key) if key is not None else None
            if key is None or run is None or run.job is not job or run.done:
                return [], False
            waiting, run.waiting = run.waiting, []
            if run.superseded:  # parked: nothing of it is answered through this run
                del self._runs[key]
                self._keys.pop(id(job), None)
                return waiting, True
            run.done = True  # until its outcome is answered: the broker may take it back
            self._ended[key] = None
            return waiting, False

    def _forget_answered(self, book: AckBook) -> None:
        """Drop ended runs whose outcome's frame is sent (the lock held). A few per call,
        oldest first; one still waiting (a stand-in on its way) goes to the back, so it
        never keeps the others from being forgotten."""
        for _ in range(min(len(self._ended), FORGET_PER_ARRIVAL)):
            key = next(iter(self._ended))
            run = self._runs.get(key)
            if run is not None and run.done and book.holds(run.live_tag()):
                self._ended.move_to_end(key)
                continue
            del self._ended[key]
            if run is not None and run.done:
                del self._runs[key]
                self._keys.pop(id(run.job), None)

    def running(self) -> int:
        """Messages tracked: running, or ended with their outcome not answered yet."""
        with self._lock:
            return len(self._runs)


class Cancels:
    """The broker's cancels and overlapping deliveries, applied (mixed into
    ``dispatch.Dispatcher``; its attributes are the dispatcher's)."""

    _overruns: Overruns
    _cancelled: list[str]
    _acks: AckBook
    _inflight: dict[int, Job]
    _pool: Any  # pool.DaemonPool or aio.Pools
    _generation: int
    _limits: DeliveryLimit
    handler: Handler
    names: Names

    def _submit_park(self, delivery: Delivery, action: StorePark) -> None:
        raise NotImplementedError

    def _broker_cancelled(self, consumer_tag: str) -> None:
        """The broker cancelled one of our consumers (``basic.cancel``: its queue deleted,
        its node gone, a delivery of it past the queue's consumer timeout). The engine's
        next tick consumes that queue again; the channel stays."""
        self._overruns.cancelled(consumer_tag, self._acks)
        self._cancelled.append(consumer_tag)

    def _admit(self, job: Job, consumer_tag: str) -> None:
        """A delivery arrived (the loop's thread): run it, or not yet, or not at all."""
        verdict = self._overruns.arrived(job, consumer_tag, self._acks)
        d = job.delivery
        if verdict == RUN:
            self._inflight[d.tag] = job
            self._pool.submit(job)
        elif verdict == WAIT:
            self._inflight[d.tag] = job  # pending: a warm stop gives it back untouched
        elif verdict == STAND_IN:
            self._limits.note(d, OVERRAN)
            logger.warning(
                "message %s on %s is still running past the queue's consumer timeout: "
                "RabbitMQ took it back and delivered it again; that delivery waits for the "
                "run to end and is settled with it (never run twice at once)",
                d.properties.get("message_id"),
                d.queue,
            )
        else:
            assert isinstance(verdict, int)
            self._submit_park(d, self._overran_park(d, verdict))

    def _run_ended(self, job: Job) -> None:
        """A run ended (any thread, before its outcome is settled): the deliveries that
        waited for it run now; a superseded run's outcome becomes a plain ack (its tag was
        taken back: nothing is sent, nothing published or parked twice)."""
        waiting, superseded = self._overruns.ended(job)
        if superseded:
            logger.warning(
                "the run of message %s on %s ended after its message was parked; its "
                "outcome is dropped",
                job.delivery.properties.get("message_id"),
                job.delivery.queue,
            )
            job.finish(HANDLED, None)
        for waiter in waiting:
            if waiter.delivery.generation == self._generation and waiter.state is not CANCELLED:
                self._pool.submit(waiter)

    def _overran_park(self, d: Delivery, times: int) -> StorePark:
        """The row parking ``d``: its message overran the consumer timeout ``times`` times
        while one run of it went on."""
        headers = d.properties.get("headers") or {}
        env = read_incoming(headers, d.exchange, d.routing_key, self.names)
        receiver = d.receiver.name if d.receiver is not None else d.queue
        park = Park(ParkReason.DELIVERY_LIMIT, overran_detail(times))
        return self.handler.parks.park(d, receiver, env, park)
