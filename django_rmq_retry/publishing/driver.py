"""The publisher's transport: a confirm window on a link whose loop the publishing thread
runs only while it waits for the broker.

A publisher belongs to one thread (``get_publisher``), and so does its driver: the thread
writes messages into a :class:`~django_rmq_retry.broker.window.ConfirmWindow`, then runs
the link's pika ``IOLoop`` until what it waits for happened (the window drained to a level,
every answer in, a connect done, an outage). Between two calls nothing runs the loop: as
with a blocking connection, the link idles then, and its owner polls it once before the
next use after a pause.

The loop is run a pass at a time through the ``IOLoop``'s public extension API
(``activate_poller`` once, then ``poll()`` and ``process_timeouts()`` until the wait is
over), the way pika's ``BlockingConnection`` runs its own: ``start()`` and ``stop()``
would set the poller up and tear it down, and wake it through its pipe, on every wait (a
single ``send`` is one wait).

Everything the broker says about a message goes through the window: acks, nacks, returns,
and the search for a message the broker refuses for what it carries (each suspect alone on
a fresh channel, on a fresh link when the broker closed the connection over it). The same
window carries the consumer's retry copies: one implementation of confirms in flight and of
that search for every publish of the package. A run ends answered, with the channel closed
by the broker (a 404: ``channel_error``), stalled (``timed_out``), or raises
``ConnectionLost`` when the connection went: the publisher decides what comes next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..broker.confirms import Outgoing
from ..broker.headerguard import decoding
from ..broker.joining import JoiningServices
from ..broker.links import Link, new_ioloop, select_link
from ..broker.translate import describe
from ..broker.window import ConfirmWindow
from ..core.errors import ConnectionLost, MessageRefused

#: Messages written between two passes of the loop (which hands them to the socket and
#: takes in the confirms meanwhile) while a batch is being written.
FLUSH_EVERY = 100
#: Seconds the loop runs, at most, when a lazy source has nothing to publish yet.
IDLE_WAIT = 0.002
#: Seconds :meth:`LinkDriver.close` gives the broker to answer the connection's close.
CLOSE_WAIT = 5.0


class Sink(Protocol):
    """Where :meth:`LinkDriver.run` puts each item it publishes (a list will do)."""

    def append(self, item: Outgoing, /) -> None: ...


@dataclass
class RunOutcome:
    """How a run ended when the connection stayed: every item answered (the defaults), the
    broker closed the channel (``channel_error``: why, as one line), or no confirm came in
    ``window.STALL_TIMEOUT`` seconds (``timed_out``)."""

    channel_error: str | None = None
    timed_out: bool = False


def _ignore(_item: Outgoing) -> None:
    """An answer's callback: the window records the answer on the item itself."""


def _no_outage_callback(_why: str, _items: list[Outgoing]) -> None:
    """The window's state says it (read after each pass of the loop)."""


class LinkDriver:
    """One link and its confirm window, on a pika ``IOLoop`` run by the owning thread.

    ``name`` is the connection's name in the broker's list (its ``connection_name``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.link: Link | None = None
        self.window: ConfirmWindow | None = None
        self._url: str | None = None
        self._ioloop: Any = None
        self._services: JoiningServices | None = None

    @property
    def is_open(self) -> bool:
        return self.link is not None and self.link.is_open

    @property
    def unconfirmed(self) -> int:
        """Messages written that have no answer yet."""
        return 0 if self.window is None else self.window.unconfirmed

    # The loop ----------------------------------------------------------------------------
    def _loop(self) -> Any:
        if self._ioloop is None:
            self._ioloop = new_ioloop()
            self._ioloop.activate_poller()  # for good: the loop is run a pass at a time
            self._services = JoiningServices(self._ioloop)
        return self._ioloop

    def _run_until(self, done: Callable[[], bool], limit: float | None = None) -> None:
        """Run the loop until ``done()`` (checked after each pass) or ``limit`` seconds."""
        if done():
            return
        ioloop = self._loop()
        expired: list[bool] = []
        timer = None if limit is None else ioloop.call_later(limit, lambda: expired.append(True))
        try:
            with decoding():  # pika decodes a returned message's headers in the callbacks
                while True:
                    assert self._services is not None
                    self._services.flush()  # what was written since the last pass, joined
                    ioloop.poll()  # waits for I/O until the next timer is due, at most
                    ioloop.process_timeouts()
                    if expired or done():
                        return
        finally:
            if timer is not None and not expired:
                ioloop.remove_timeout(timer)

    def poll(self) -> None:
        """One pass of the loop: written frames go out, what arrived is read (a close the
        broker sent while the link idled, confirms)."""
        self._run_until(lambda: False, 0)

    # The link ----------------------------------------------------------------------------
    def connect(self, url: str | None, after: str | None) -> Link:
        """Open the link (``BROKER_URLS`` in failover order after ``after`` unless ``url``);
        raises what ``broker.connect`` would (``BrokerUnavailable``, ``AccessRefused``)."""
        self.drop()
        self._url = url
        done: list[Link | Exception] = []
        ioloop = self._loop()
        select_link(
            ioloop, done.append, url=url, after=after, services=self._services, name=self.name
        )
        self._run_until(lambda: bool(done))
        outcome = done[0]
        if isinstance(outcome, Exception):
            raise outcome
        self.link = outcome
        return outcome

    def _relink(self, on_done: Callable[[Any], None]) -> None:
        """The window's way on after the broker closed the connection over one message."""

        def opened(outcome: Link | Exception) -> None:
            if isinstance(outcome, Link):
                self.link = outcome
            on_done(outcome)

        ioloop = self._loop()
        select_link(ioloop, opened, url=self._url, services=self._services, name=self.name)

    def drop(self) -> None:
        """Forget the window and the link, closing them without waiting: the broker's
        answer is read the next time the loop runs (a connect, a close)."""
        window, self.window = self.window, None
        if window is not None:
            window.close()
        link, self.link = self.link, None
        if link is not None and link.is_open:
            link.close()

    def close(self) -> None:
        """Close the link and wait (``CLOSE_WAIT`` at most) for the broker to say so: a
        socket just dropped makes the broker log "client unexpectedly closed"."""
        link = self.link
        self.drop()
        if self._ioloop is None:
            return
        if link is not None:
            self._run_until(lambda: link.close_reason is not None, CLOSE_WAIT)
        self._ioloop.deactivate_poller()
        self._ioloop.close()
        self._ioloop = self._services = None

    def forget(self) -> None:
        """After a fork: the link and the loop are the parent's; leave them untouched."""
        self.link = self.window = self._ioloop = self._services = None

    # Publishing --------------------------------------------------------------------------
    def _window_now(self) -> ConfirmWindow:
        window = self.window
        link = self.link
        if link is None or not link.is_open:
            raise ConnectionLost("the publisher's connection is closed")
        if window is None or window.state in ("outage", "closed") or window.link is not link:
            if window is not None:
                window.close()
            window = ConfirmWindow(
                link,
                on_outage=_no_outage_callback,
                relink=self._relink,
                # As before the window: a caller hears within STALL_TIMEOUT, alarm or not.
                wait_out_alarms=False,
            )
            self.window = window
        return window

    def run(
        self, items: Iterable[Outgoing | None], window: int, sent: Sink | None = None
    ) -> RunOutcome:
        """Publish ``items`` as the iterable yields them, then wait for every answer.

        At most ``window`` messages are unconfirmed at once (a full window waits until half
        are answered). The iterable may be lazy (rows read from a database cursor) and may
        yield ``None`` when it has nothing yet: the loop then runs (``IDLE_WAIT`` at most,
        less when an answer comes), so the answers it waits for arrive. Each item
        published is appended to ``sent`` (when given) before it is written. A message
        the broker would refuse, or refuses, ends ``refused`` and the others flow.

        Raises ``ConnectionLost`` if the connection went (what had no answer has state
        ``""``). A run that does not finish (the source raised) closes the window's
        channel: its confirms are never waited for, and the next run opens another.
        """
        win = self._window_now()
        try:
            self._write(win, iter(items), window, sent)
            self._run_until(lambda: not win.unconfirmed or _ended(win))
        except BaseException:
            if self.window is win:
                self.window = None
                win.close()
            raise
        return self._outcome(win)

    def _write(
        self,
        win: ConfirmWindow,
        source: Any,
        window: int,
        sent: Sink | None,
    ) -> None:
        low = window // 2
        written = 0
        while not _ended(win):
            item = next(source, _END)
            if item is _END:
                return
            if item is None:  # nothing yet: take answers in meanwhile
                self._run_until(_answered_from(win, win.unconfirmed), IDLE_WAIT)
                continue
            if win.unconfirmed >= window:
                self._run_until(lambda: win.unconfirmed <= low or _ended(win))
                if _ended(win):
                    return
            if sent is not None:
                sent.append(item)
            try:
                win.submit(item, _ignore)
            except MessageRefused:
                continue  # refused before it was sent: its answer is on the item
            except ConnectionLost:
                return  # the window is an outage already
            written += 1
            if written % FLUSH_EVERY == 0:
                # Frames wait in pika's buffer until the loop runs: hand them to the socket
                # (and take in confirms) while the next ones are built.
                self.poll()

    def _outcome(self, win: ConfirmWindow) -> RunOutcome:
        if win.state != "outage":
            return RunOutcome()
        if self.window is win:
            self.window = None
        if not self.is_open:
            why = describe(win.cause) if win.cause is not None else win.why
            raise ConnectionLost(why)
        if win.cause is not None:
            return RunOutcome(channel_error=describe(win.cause))
        return RunOutcome(timed_out=True)


_END: Any = object()


def _ended(win: ConfirmWindow) -> bool:
    return win.state in ("outage", "closed")


def _answered_from(win: ConfirmWindow, unconfirmed: int) -> Callable[[], bool]:
    """Whether an answer came (or the window ended) since ``unconfirmed`` were waiting."""
    return lambda: win.unconfirmed < unconfirmed or _ended(win)


__all__ = ["LinkDriver", "RunOutcome"]
