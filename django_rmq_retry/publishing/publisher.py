"""Publishing with publisher confirms: one publisher, one confirm window behind it.

The public ways to publish are ``Topic.send``, ``Topic.send_many``, ``Topic.send_on_commit``
and the outbox; they land here. A publish returns only once the broker confirmed it; an
unroutable message (no queue bound) raises instead of being silently dropped.

Every thread publishes on a connection of its own (``per_thread.get_publisher``, as
Django's database connections), so no lock is shared between threads.

One confirm window (``broker.ConfirmWindow`` on a link whose loop the publishing thread
runs while it waits: :mod:`.driver`) carries every message, a single ``send`` included: the
retry copies' implementation of confirms in flight and of the search for a message the
broker refuses for what it carries. One reconnect rule (a connection lost mid-publish is replaced and
what got no answer is published again, once: at-least-once) and one nack rule (a nacked
message is published again after pauses of up to ``PUBLISH_NACK_WAIT`` seconds in all, see
:func:`nack_pauses`). The outbox relay's stream (:meth:`Publisher.stream_items`) neither
reconnects nor pauses: the relay keeps what got no answer, and backs a nacked row off.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import broker
from ..conf import app_settings, current_plan
from ..core.backoff import pauses_within
from ..core.envelope import build_properties
from ..core.errors import (
    BrokerUnavailable,
    ConnectionLost,
    MessageRefused,
    NackedError,
    PublishError,
    UnroutableError,
)
from ..registry import default_registry
from .batch_stream import Batch, BatchStream
from .results import (
    PublishOutcome,
    PublishResult,
    answers,
    batch_error,
    encode_body,
    outgoing,
    undeclared_hint,
    unrouted_hint,
)

if TYPE_CHECKING:  # the driver loads pika: imported when a publisher first connects
    from ..broker.links import Link
    from .driver import LinkDriver, RunOutcome, Sink

logger = logging.getLogger("django_rmq_retry.publishing.publisher")

#: Messages a batch keeps unconfirmed at once (bounds client memory, keeps the pipe full).
BATCH_WINDOW = 1000
#: A connection idle for longer is polled before use, so one the broker closed meanwhile
#: (missed heartbeats, a restart) is replaced quietly instead of failing the publish first.
_IDLE_CHECK_AFTER = 1.0


def nack_pauses() -> tuple[float, ...]:
    """Pauses before publishing a nacked message again, ``PUBLISH_NACK_WAIT`` seconds in all.

    A nack says the broker could not store the message *now*: a quorum queue's leader
    moving while a cluster node stops, a queue process restarting, or a full queue with
    ``overflow=reject-publish``. The first two pass, but not always in seconds: while a node
    stops, its queues' leaders refuse until the node is gone and the others have elected
    new ones, which takes as long as the cluster needs, not a number of tries: the wait is
    therefore a budget in seconds.
    The last case raises ``NackedError`` once the wait is spent. A message routed to several
    queues may be stored again in those that did take it (same ``message_id``).
    """
    return pauses_within(float(app_settings.PUBLISH_NACK_WAIT))


_pause = time.sleep  # (tests make the pause do something)

_T = TypeVar("_T")

__all__ = [
    "BATCH_WINDOW",
    "PublishOutcome",
    "PublishResult",
    "Publisher",
    "build_properties",
    "encode_body",
    "nack_pauses",
]


class Publisher:
    """A lazily opened link and its confirm window, used by one thread at a time.

    :func:`get_publisher` gives each thread its own. Nothing here is shared between
    threads, so nothing here holds a lock while it waits (for a confirm, a pause after a
    nack, a connect): a neighbour never waits behind it.

    Users publish through ``Topic.send``, ``send_many``, ``send_on_commit`` and the outbox.
    The package's own callers use four methods:

    - :meth:`send_bodies` (``Topic``): encode bodies, publish them, return their
      :class:`PublishResult` once every one is confirmed;
    - :meth:`send_items` (deferred tasks): the same for messages already built;
    - :meth:`stream_items` (the outbox relay): a lazy source, each message's answer told;
    - :meth:`stream_batches` (the requeue): batch after batch, each handed back answered.

    ``_send_batch`` and ``_send_stream`` are the transport under them, the part
    ``testing``'s in-memory publisher replaces.
    """

    def __init__(self, url: str | None = None, *, declare: bool | None = None) -> None:
        self._url = url
        #: Declare the whole topology on connecting: ``DECLARE_ON_SEND`` unless given. Off by
        #: default: a publisher needs write permission only (docs/howto/permissions.md).
        self._declare = declare
        #: The link and its confirm window (made on first use: it loads pika).
        self._driver: LinkDriver | None = None
        #: The process that made the connection (a forked child never uses the parent's).
        self.pid = os.getpid()
        #: The URL of the connection dropped last: the next connect tries the next URL first.
        self._dropped_url: str | None = None
        self._last_used = 0.0  # time.monotonic() of the last publish on this connection
        #: ``per_thread.reset_publisher``'s count when ``get_publisher`` made this one.
        self.generation = 0

    @property
    def _link(self) -> Link | None:
        """The open (or last) connection, ``None`` before the first publish."""
        return None if self._driver is None else self._driver.link

    # Connection management ----------------------------------------------------------------
    def _link_driver(self) -> LinkDriver:
        if self.pid != os.getpid():  # forked: never share a socket with the parent
            if self._driver is not None:
                self._driver.forget()
            self.pid = os.getpid()
        if self._driver is None:
            from .driver import LinkDriver

            name = f"django-rmq-retry publisher {app_settings.PREFIX} pid {os.getpid()}"
            self._driver = LinkDriver(name)
        return self._driver

    def _ensure_connection(self) -> Link:
        driver = self._link_driver()
        now = time.monotonic()
        if driver.is_open and now - self._last_used > _IDLE_CHECK_AFTER:
            # Only after a pause: in a busy loop every publish already runs the loop (for
            # its confirms), and a pass more would add to each send. A connection that dies
            # between two busy publishes fails that publish, which then reconnects and
            # publishes again (the same at-least-once path).
            driver.poll()
        self._last_used = now
        if not driver.is_open:
            self._drop()
            link = driver.connect(self._url, after=self._dropped_url)
            declare = app_settings.DECLARE_ON_SEND if self._declare is None else self._declare
            if declare:
                try:
                    self._declare_topology(link.url)
                except Exception:  # a conflict (TopologyError), the broker gone meanwhile
                    self._drop()
                    raise
            return link
        assert driver.link is not None
        return driver.link

    def _declare_topology(self, url: str) -> None:
        """Declare the whole topology (``DECLARE_ON_SEND``) on the broker ``url`` names.

        On a short-lived blocking connection beside the link: the declaration happens once
        per connect, and ``broker.topology`` declares through one blocking channel for every
        caller (``rmq_setup``, the consumer), with its error texts. Written again as
        callbacks on the link it would be a second copy of that order and those texts for
        no gain: nothing else runs on this thread's loop while it waits.
        """
        connection = broker.connect(url, name=f"django-rmq-retry declare pid {os.getpid()}")
        try:
            connection.channel().declare(current_plan(default_registry.all()))
        finally:
            connection.close()

    def _retire_window(self) -> None:
        """Close the window's channel (confirms pending on it are never waited for)."""
        driver = self._driver
        if driver is not None and driver.window is not None:
            window, driver.window = driver.window, None
            window.close()

    def _drop(self) -> None:
        driver = self._driver
        if driver is None:
            return
        if driver.link is not None:
            self._dropped_url = driver.link.url
        driver.drop()

    def close(self) -> None:
        driver = self._driver
        if driver is None:
            return
        if driver.link is not None:
            self._dropped_url = driver.link.url
        driver.close()

    def _reconnecting(
        self,
        publish: Callable[[], _T],
        give_up: Callable[[ConnectionLost], PublishError | None],
        unreachable: Callable[[str], PublishError],
    ) -> _T | None:
        """Run ``publish``; if the connection was lost, reconnect and run it once more.

        After a second loss ``give_up(exc)`` says what to raise (``None``: nothing was left
        unconfirmed after all); a broker that cannot be reached raises ``unreachable(why)``.
        A channel the broker closed (no such exchange, ...) is not retried: it is the
        outcome's ``channel_error``, which the caller turns into its own error.
        """
        for attempt in (1, 2):
            try:
                return publish()
            except BrokerUnavailable as exc:
                raise unreachable(str(exc)) from exc
            except ConnectionLost as exc:
                self._drop()
                if attempt == 2:
                    error = give_up(exc)
                    if error is None:
                        return None
                    raise error from exc
                logger.warning("publisher connection lost (%s); reconnecting", exc)
        raise AssertionError("unreachable")

    # Publishing ---------------------------------------------------------------------------
    def send_bodies(
        self,
        routing_key: str,
        bodies: Iterable[Any],
        *,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        exchange: str | None = None,
        **properties: Any,
    ) -> list[PublishResult]:
        """Encode ``bodies`` as messages for ``routing_key`` and publish them; returns their
        :class:`PublishResult`, in order, once the broker confirmed every one.

        For ``Topic.send`` and ``send_many``. Raises as :meth:`send_items` does; a body that
        is not JSON serialisable raises ``TypeError`` before anything is sent.
        """
        items = outgoing(
            routing_key,
            bodies,
            headers=headers,
            content_type=content_type,
            exchange=exchange,
            **properties,
        )
        if items:
            self.send_items(items)
        return [PublishResult(i.message_id, i.exchange, i.routing_key) for i in items]

    def send_items(self, items: list[broker.Outgoing], window: int = BATCH_WINDOW) -> None:
        """Publish ``items`` pipelined; returns once the broker confirmed every one (acked,
        not returned).

        Otherwise raises ``PublishError``: ``MessageRefused`` for a message the broker refuses
        for what it carries, ``NackedError``, ``UnroutableError``, or ``PublishError`` itself
        when some message got no answer (the broker could not be reached after one
        reconnect, the channel closed, no confirm in time). Its ``confirmed`` and ``failed``
        say which of ``items`` the broker did confirm.
        """
        self._answer(items, window)
        refused = [i for i in items if i.refused]
        if refused:
            first = refused[0]
            error = batch_error(
                items,
                f"the broker refuses message {first.message_id!r} to {first.exchange!r} "
                f"(routing key {first.routing_key!r}): {first.refused}"
                + (f"; {len(refused) - 1} more refused" if len(refused) > 1 else ""),
                MessageRefused,
            )
            error.message_id, error.reason = first.message_id, first.refused
            raise error
        nacked = sum(1 for i in items if i.nacked)
        returned = sum(1 for i in items if i.returned)
        if nacked:
            raise batch_error(
                items,
                f"the broker refused (nacked) {nacked} message(s) to {items[0].exchange!r}"
                + (f" and returned {returned} as unroutable" if returned else ""),
                NackedError,
            )
        if returned:
            raise batch_error(
                items,
                f"no queue is bound for routing key {items[0].routing_key!r} on exchange "
                f"{items[0].exchange!r}: {returned} message(s) were returned, not stored"
                + unrouted_hint(items[0]),
                UnroutableError,
            )

    def _answered(self, items: Sequence[broker.Outgoing], window: int = BATCH_WINDOW) -> None:
        """Publish ``items`` until each has its final answer (``item.nacked`` /
        ``item.returned`` are answers, not exceptions). Raises ``PublishError`` only when
        some item got none (the broker could not be reached after one reconnect, the
        channel closed, no confirm in time)."""
        if not items:
            return
        try:
            self._answer(list(items), window)
        except PublishError:
            if any(i.nacked or i.returned for i in items) and all(i.state for i in items):
                return  # every message was answered: the failures are per message
            raise

    def stream_items(
        self, items: Iterable[broker.Outgoing | None], window: int = BATCH_WINDOW
    ) -> PublishOutcome:
        """Publish ``items`` as the iterable yields them; returns what the broker said of
        each one published (:class:`PublishOutcome`).

        For a lazy source (the outbox relay reading rows from a database cursor), so
        reading the next rows overlaps the broker's work on the last ones. A source that
        waits for the answers to what it gave yields ``None`` while it has nothing else:
        answers keep arriving meanwhile (items are answered as they come). No reconnect:
        if some item got no answer (connection lost, channel closed, no confirm in time)
        the stream stops there and the outcome's ``error`` says why (the caller keeps the
        unanswered items for later). An exception of the source is raised as it is.
        """
        sent: list[broker.Outgoing] = []
        try:
            self._send_stream(items, window, sent)
        except PublishError as exc:
            return PublishOutcome.of(sent, exc)
        return PublishOutcome.of(sent)

    def _send_stream(
        self,
        items: Iterable[broker.Outgoing | None],
        window: int,
        sent: list[broker.Outgoing] | None = None,
    ) -> None:
        """The transport's part of :meth:`stream_items` and :meth:`stream_batches`
        (``testing`` has its own): ``sent`` (if given) collects what was published.

        A message the broker refuses for what it carries is found by the window while the
        stream goes on (``item.refused``); the stream ends early only when the connection
        went, the broker closed the channel, or no confirm came in time (raised)."""
        try:
            outcome = self._run(items, window, sent)
        except BrokerUnavailable as exc:
            raise PublishError(str(exc)) from exc
        except ConnectionLost as exc:
            self._drop()
            raise PublishError(f"publish failed: {exc}") from exc
        if outcome.channel_error is not None:
            raise PublishError(f"publish failed: {outcome.channel_error}")
        if outcome.timed_out:
            self._drop()
            raise PublishError("the broker did not confirm every message in time")

    def stream_batches(
        self,
        batches: Iterable[Batch | None],
        answered: Callable[[Batch], None],
        window: int = BATCH_WINDOW,
        most: int | None = None,
        deadline: float | None = None,
    ) -> None:
        """Publish batch after batch in one stream of confirms; ``answered(batch)`` runs on
        this thread once each of a batch's items has its final answer, in the batches' order.
        Returns once the source is spent and every batch was handed back: what became of
        each message is on its item (``confirmed``, ``nacked``, ``returned``, ``refused``).

        The next batches are written while the broker confirms the last (see
        :mod:`.batch_stream`), at most ``most`` batches in flight at once (when given: their
        bodies are memory); ``batches`` may yield ``None`` while it has nothing yet. An
        item ends confirmed, nacked (after :func:`nack_pauses`) or returned, as with
        the batches of :meth:`_answered`. Raises ``PublishError`` when some item got no answer (the
        broker could not be reached after one reconnect, the channel closed, no confirm in
        time), after handing back every batch in flight (those items keep state ``""``);
        an exception of the source is raised once what was in flight is answered. One of
        ``answered`` is raised at once: the batches after it are not handed back, and the
        channel their confirms were due on is closed.

        ``deadline`` (a ``time.monotonic()`` value) bounds the pauses after nacks: one that
        would end past it is not taken, and what it was for stays nacked (an answer:
        refused). A caller with a time budget (the admin's requeue click) is otherwise held
        up to ``PUBLISH_NACK_WAIT`` past it while a cluster node stops.
        """
        stream = BatchStream(iter(batches), answered, most)
        idle_failures = 0  # streams in a row that failed before publishing anything
        while True:
            try:
                self._send_stream(stream.items(), window)
                idle_failures = 0
            except PublishError:
                # Dropped or reset already; what got no answer is published again below.
                idle_failures = idle_failures + 1 if not stream.published else 0
                if idle_failures >= 2:
                    stream.settle(lambda items: None)
                    raise
            stream.settle(lambda items: self._answer(items, window, deadline))
            if stream.error is not None:
                raise stream.error
            if stream.exhausted:
                return

    def _run(
        self, items: Iterable[broker.Outgoing | None], window: int, sent: Sink | None = None
    ) -> RunOutcome:
        """``LinkDriver.run`` on this publisher's link, (re)connected first: raises
        ``BrokerUnavailable`` when no broker can be reached, ``ConnectionLost`` when the
        connection went meanwhile. A source that raises (or a stream's ``answered``) leaves
        no confirm pending: the run closes that channel first."""
        self._ensure_connection()  # (re)connects; notices a dead connection
        assert self._driver is not None
        return self._driver.run(items, window, sent)

    def _answer(
        self, items: list[broker.Outgoing], window: int, deadline: float | None = None
    ) -> None:
        """Publish ``items`` until each has its final answer: a nacked one is published
        again after each of :func:`nack_pauses` (those that end by ``deadline``, if given).
        Raises ``PublishError`` when some got none."""
        self._send_batch(items, window)
        for pause in nack_pauses():
            again = [i for i in items if i.nacked]
            if not again:
                break
            if deadline is not None and time.monotonic() + pause > deadline:
                logger.warning(
                    "the broker nacked %d message(s) to %r; not publishing them again: "
                    "the caller's time is up",
                    len(again),
                    again[0].exchange,
                )
                break
            logger.warning(
                "the broker nacked %d message(s) to %r; publishing them again in %.1fs",
                len(again),
                again[0].exchange,
                pause,
            )
            _pause(pause)
            for item in again:
                item.state = ""
            self._send_batch(again, window)

    def _send_batch(self, items: list[broker.Outgoing], window: int) -> None:
        """The transport's part of a batch: every item ends acked, nacked or returned, or
        this raises ``PublishError`` (connection lost twice, channel closed, no answer)."""
        todo = list(range(len(items)))

        def publish() -> RunOutcome | None:
            nonlocal todo
            # After a lost connection, which messages got through is unknown for every
            # one not confirmed yet: those are published again (at-least-once).
            todo = [i for i in todo if not items[i].confirmed and not items[i].refused]
            if not todo:
                return None
            return self._run((items[i] for i in todo), window)

        def give_up(exc: ConnectionLost) -> PublishError | None:
            if all(items[i].confirmed for i in todo):
                return None
            return batch_error(items, f"publish failed: {exc}", PublishError)

        def unreachable(why: str) -> PublishError:
            return PublishError(why, **answers(items))

        outcome = self._reconnecting(publish, give_up, unreachable)
        if outcome is None:
            return
        if outcome.channel_error is not None:
            raise batch_error(
                items,
                f"publish to {items[0].exchange!r} failed: {outcome.channel_error}"
                + undeclared_hint(str(outcome.channel_error)),
                PublishError,
            )
        if outcome.timed_out:
            self._drop()
            raise batch_error(
                items, "the broker did not confirm every message in time", PublishError
            )
