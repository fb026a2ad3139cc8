"""The consumer on one asyncio event loop: :class:`Consumer`.

:meth:`Consumer.run` creates an asyncio loop in the calling thread and runs it, inside
``broker.decoding()`` (pika decodes the properties of deliveries in the loop's callbacks),
until stopped. Two links (``broker.links``) share that loop: the consumer's (the consume
channel, its acks and nacks) and one for retry copies (a ``broker.ConfirmWindow``, with no
blocked-connection timeout, so a memory or disk alarm holds the copies but never the acks).
Nothing on the loop waits on the broker: every step is a callback, a timer or an ``await``,
so both links' heartbeats flow while the window isolates a copy the broker refuses, and
deliveries keep arriving and settling meanwhile.

Receivers run elsewhere (``dispatch``: the receiver threads, the async receivers' own
loop), or, for ``async def`` receivers with ``ASYNC_ON_IO_LOOP``, on this loop as tasks
(``aio``); their outcomes come back through the hand-back, whose wake-up is a
``call_soon_threadsafe`` of the drain. A signal handler only sets the stop flag: a tick of
the loop (``TICK`` seconds) notices it, checks a bounded run, resumes cancelled consumers
and decides spare windows.

The topology is declared on a short-lived blocking connection in a worker thread
(``run_in_executor``): the loop keeps serving heartbeats (and, on a re-declare after a
``basic.cancel``, the other queues) while it runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import broker
from ..conf import app_settings, current_plan
from ..core.backoff import CappedBackoff
from ..core.errors import BrokerUnavailable, ConnectionLost, MessageRefused, TopologyError
from ..core.topology_plan import Plan
from .actions import Delivery, PublishRetry
from .dispatch import Dispatcher, Stats, _log_blocked

logger = logging.getLogger("django_rmq_retry.consumer")

#: Seconds between two ticks of the loop: how soon a stop request (or a bounded run's end)
#: is noticed.
TICK = 0.1
#: Seconds a warm shutdown out of time gives abandoned async attempts to unwind.
ABANDON_WAIT = 1.0
#: Seconds the links get to close at the end of a run.
CLOSE_WAIT = 5.0

T = TypeVar("T")


def _loop_running_here() -> bool:
    """Whether this thread runs an asyncio event loop now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _declare(url: str, the_plan: Plan) -> None:
    """Worker thread: declare ``the_plan`` on a short-lived blocking connection of its own
    (the loop's links stay served meanwhile). ``TopologyError`` names a conflict."""
    connection = broker.connect(url, name="django-rmq-retry consumer topology")
    try:
        connection.channel().declare(the_plan)
    finally:
        connection.close()


class Consumer(Dispatcher):
    """Consume the given receivers' queues until stopped (or a bounded run ends), with the
    broker I/O on one asyncio loop (see the module docstring): ``run()``,
    ``request_stop()``, ``stopping``, ``running()``, ``stats``."""

    _loop: asyncio.AbstractEventLoop | None = None
    _connection: broker.Link | None
    _copies_link: broker.Link | None = None
    _window: broker.ConfirmWindow | None = None
    #: Resolved (with the ``ConnectionLost`` to raise) once this generation is lost.
    _lost: asyncio.Future[ConnectionLost] | None = None
    _flush_due = False

    # Public control -------------------------------------------------------------------------
    def run(self) -> Stats:
        if not _loop_running_here():
            return self._run_here()
        # A thread already running an event loop cannot run another (Playwright's sync API
        # in a test, a notebook, async code calling this): the consumer's loop runs on a
        # thread of its own, and this call waits for it. A stop request still reaches it
        # (a flag), and the short joins leave this thread's signal handlers free to run.
        failures: list[BaseException] = []

        def run_there() -> None:
            try:
                self._run_here()
            except BaseException as exc:  # raised again in the caller's thread
                failures.append(exc)

        thread = threading.Thread(target=run_there, name="rmq-consumer-loop", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
        if failures:
            raise failures[0]
        return self.stats

    def _run_here(self) -> Stats:
        if self._housekeeper is not None:
            self._housekeeper.start()
        if self._breakers:
            self._breakers.start()  # reads the breakers before the first connection
        loop = asyncio.new_event_loop()
        self._loop = loop
        on_loop = self._async_on_loop  # async receivers on this loop (ASYNC_ON_IO_LOOP)
        try:
            with broker.decoding():
                if on_loop is not None:
                    on_loop.start_on(loop)
                loop.run_until_complete(self._main())
        finally:
            if on_loop is not None:  # what still runs there is abandoned, then unwinds
                loop.run_until_complete(on_loop.aclose())
            self._loop = None  # a late wake-up from a receiver thread finds no loop
            self._close()
            loop.close()
        return self.stats

    async def _main(self) -> None:
        backoff = CappedBackoff(0.5, float(app_settings.RECONNECT_MAX_DELAY))
        first = True
        try:
            while not self._stop.is_set():
                try:
                    await self._connect_and_declare()
                    backoff.reset()  # consuming again: the backoff starts over
                    first = False
                    await self._consume_until_stopped()
                    break
                except (BrokerUnavailable, ConnectionLost, TopologyError) as exc:
                    self._connect_failed(exc, first, backoff.current)
                await self._wait_to_reconnect(backoff.next())
        finally:
            await self._close_links()

    async def _wait_to_reconnect(self, seconds: float) -> None:
        hooks = self._hooks
        if hooks is not None:
            hooks.reconnecting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self._stop.is_set() and (left := deadline - loop.time()) > 0:
            if hooks is not None:
                hooks.loop_tick(False)  # alive (waiting on purpose), not ready
            await asyncio.sleep(min(left, TICK))

    # Connection lifecycle -------------------------------------------------------------------
    async def _link(self, **options: Any) -> broker.Link:
        """A link on this loop (``links.asyncio_link``: failover, our error texts)."""
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[broker.Link | Exception] = loop.create_future()

        def done(result: broker.Link | Exception) -> None:
            if not opened.done():
                opened.set_result(result)

        broker.asyncio_link(loop, done, **options)
        result = await opened
        if isinstance(result, Exception):
            raise result
        return result

    async def _until(self, step: Awaitable[T]) -> T:
        """``await step``, unless this connection is lost first (``ConnectionLost``)."""
        assert self._lost is not None
        lost = self._lost
        task = asyncio.ensure_future(step)
        await asyncio.wait((task, lost), return_when=asyncio.FIRST_COMPLETED)
        if lost.done():  # even if the step is done too: what follows would use a dead link
            task.cancel()
            raise lost.result()
        return task.result()

    def _fail(self, generation: int, why: str) -> None:
        """This generation's connection is lost: the next tick raises ``ConnectionLost``;
        unacked deliveries return to their queues with the connection."""
        lost = self._lost
        if generation == self._generation and lost is not None and not lost.done():
            lost.set_result(ConnectionLost(why))

    async def _connect_and_declare(self) -> None:
        self._new_generation()
        generation = self._generation
        loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        name = f"django-rmq-retry consumer {self.names.prefix} pid {os.getpid()}"
        link = await self._link(after=self._lost_url, name=name)
        self._connection = link
        link.on_blocked(functools.partial(_log_blocked, "consumer"))
        link.on_closed(lambda _reason: self._fail(generation, link.closed_why))
        plan = current_plan(self.receivers, self.names)
        await self._until(loop.run_in_executor(None, _declare, link.url, plan))
        copies = await self._until(self._copies_link_for(link.url, name))
        self._window = broker.ConfirmWindow(
            copies,
            on_outage=lambda why, _items: self._fail(generation, why),
            relink=functools.partial(self._relink, generation, link.url, name),
            label="retry copies",
        )
        opened: asyncio.Future[broker.ConsumeChannel] = loop.create_future()

        def channel_closed(why: str) -> None:
            # e.g. consumer_timeout: 406 acknowledgement timed out
            self._fail(generation, f"RabbitMQ closed the consumer's channel: {why}")

        def channel_opened(channel: broker.ConsumeChannel) -> None:
            if not opened.done():  # (given up if the connection was lost first)
                opened.set_result(channel)

        broker.ConsumeChannel.open(link, channel_opened, channel_closed)
        channel = await self._until(opened)
        self._start_consuming(channel, plan, link.url)

    async def _copies_link_for(self, url: str, name: str) -> broker.Link:
        # No blocked-connection timeout: during an alarm the copies wait as long as it
        # lasts (their originals stay unacked, not given back) while acks flow on the other.
        copies = await self._link(
            url=url, name=f"{name} retry copies", blocked_connection_timeout=None
        )
        self._adopt_copies(copies)
        return copies

    def _adopt_copies(self, copies: broker.Link) -> None:
        self._copies_link = copies
        copies.on_blocked(functools.partial(_log_blocked, "retry-copies"))
        # Retry copies are fitted to the frame limit of the connection that publishes them.
        self.handler.frame_max = copies.frame_max

    def _relink(self, generation: int, url: str, name: str, on_done: Callable[[Any], None]) -> None:
        """The broker closed the copies' connection over one copy (a frame error): a new
        one, so the window's search goes on; the consumer's connection stays."""

        def opened(result: broker.Link | Exception) -> None:
            if generation != self._generation:
                if not isinstance(result, Exception):
                    result.close()  # the window it was for is gone
                return
            if not isinstance(result, Exception):
                self._adopt_copies(result)
            on_done(result)

        assert self._loop is not None
        broker.asyncio_link(
            self._loop,
            opened,
            url=url,
            name=f"{name} retry copies",
            blocked_connection_timeout=None,
        )

    async def _resume_cancelled(self) -> None:
        """Declare the topology again (in a worker thread) and consume the queues whose
        consumers the broker cancelled; a queue that cannot be declared raises."""
        queues = self._cancelled_queues()
        if not queues:
            return
        assert self._connection is not None
        plan = current_plan(self.receivers, self.names)
        loop = asyncio.get_running_loop()
        await self._until(loop.run_in_executor(None, _declare, self._connection.url, plan))
        for queue_name in queues:
            if self._breakers.consumes_at_start(queue_name):  # not while its breaker is open
                self._consume(queue_name)

    def _close_connections(self) -> None:
        window, self._window = self._window, None
        if window is not None:
            window.close()  # its unanswered copies' originals are redelivered
        for link in (self._connection, self._copies_link):
            if link is not None:
                try:
                    link.close()
                except Exception:  # already broken: nothing to clean
                    logger.debug("closing a link failed", exc_info=True)
        self._connection = self._copies_link = None

    async def _close_links(self) -> None:
        """Close both links and let the loop run until they are closed (or ``CLOSE_WAIT``)."""
        links = [link for link in (self._connection, self._copies_link) if link is not None]
        self._close_connections()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_WAIT
        while any(link.close_reason is None for link in links) and loop.time() < deadline:
            await asyncio.sleep(0.01)

    # Main loop ------------------------------------------------------------------------------
    async def _tick(self, seconds: float) -> None:
        """Wait up to ``seconds`` (callbacks run meanwhile), then the chores of a tick;
        ``ConnectionLost`` once this connection is lost."""
        lost = self._lost
        assert lost is not None
        if not lost.done():
            await asyncio.wait((lost,), timeout=seconds)
        if lost.done():
            raise lost.result()
        if self._done:
            # Safety net: a wake-up lost with a loop that was closing must never leave
            # finished deliveries unsettled (and the prefetch window full).
            self._drain()
        self._flush_acks()
        if self._cancelled:
            await self._resume_cancelled()
        if self._breakers and not self._winding_down:
            self._breakers.adjust(self)  # dependencies down or back: stop or resume queues
        self._consume_standby()  # other processes' partitions, once they took theirs
        self._check_spares()

    async def _consume_until_stopped(self) -> None:
        self._last_activity = time.monotonic()
        self._winding_down = False
        hooks = self._hooks
        while not self._stop.is_set():
            await self._tick(TICK)
            if hooks is not None:  # consuming every queue (a tick resumes a cancelled one)
                hooks.loop_tick(True)
            if self._bounded_run_over():
                break
        await self._warm_shutdown()

    async def _warm_shutdown(self) -> None:
        """Stop consuming, let in-flight receivers finish and act on them, then close.

        Within ``shutdown_timeout``: with async receivers, the last ``ABANDON_WAIT`` (at
        most a quarter of it) is kept to abandon the attempts still running, so none
        completes after its delivery went back to the broker."""
        if not self._begin_warm_shutdown():
            return
        abandon = getattr(self._pool, "abandon_running", None)
        unwind = min(ABANDON_WAIT, self.shutdown_timeout / 4) if abandon is not None else 0.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout - unwind
        while self._inflight and (left := deadline - loop.time()) > 0:
            try:
                await self._tick(min(TICK, left))
            except ConnectionLost:
                return  # the broker has every unsettled delivery back
            self._still_waiting()
        if self._inflight:
            if abandon is not None:
                await loop.run_in_executor(None, abandon, unwind)
            self._log_unfinished()
        self._close_connections()

    # Settling (the loop's thread) -----------------------------------------------------------
    def _call_drain(self) -> None:
        """Any thread: run :meth:`_drain` on the loop."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._drain_if_connected)
        except RuntimeError:  # the loop is closed: its deliveries will be redelivered
            logger.debug("could not wake the consumer's loop", exc_info=True)

    def _drain_if_connected(self) -> None:
        if self._connection is not None:
            self._drain()

    def _schedule_flush(self) -> None:
        """Acks settled by confirms go out once per turn of the loop, not once per confirm."""
        if not self._flush_due and self._loop is not None:
            self._flush_due = True
            self._loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_due = False
        self._flush_acks()

    def _publish_retry(self, delivery: Delivery, action: PublishRetry) -> None:
        """Publish the retry copy through the confirm window; ack the original only once the
        broker confirmed the copy. The delivery stays in flight (a warm shutdown waits for
        it) until then; a copy the broker refuses for what it carries parks the original."""
        generation = self._generation

        def answered(item: broker.Outgoing) -> None:
            if generation != self._generation:
                return  # the connection was replaced: the original is redelivered
            if item.state == "refused":
                self._park_refused(delivery, action, item.refused)
                return
            acked = item.state == "ack"
            self._copy_settled(
                delivery,
                action,
                acked and not item.returned,
                broker.settled_reason(acked, item.returned),
            )
            self._schedule_flush()

        window = self._window
        if window is None:
            return  # no connection: the original is redelivered
        item = broker.Outgoing(
            action.exchange, action.routing_key, action.body, action.properties, action.wire
        )
        try:
            window.submit(item, answered)
        except MessageRefused as exc:  # known before the broker refuses it: nothing sent
            self._park_refused(delivery, action, exc.reason)
        except ConnectionLost:
            pass  # the window's outage ends this connection: the original is redelivered
