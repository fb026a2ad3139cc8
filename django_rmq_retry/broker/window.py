"""One confirm window: messages published on a link's confirm channel, many confirms in
flight, each answered through its own callback, on the link's loop and never waiting on it.

:class:`ConfirmWindow` writes each submitted :class:`~.confirms.Outgoing` with its
properties encoded once (``wire.Encoded``, through pika's public ``basic_publish``) and
calls ``on_answer(item)`` when the broker acked or nacked it (``item.state``; a
``basic.return`` before the ack sets ``item.returned``, matched by id, route and body).

**Isolation.** The broker answers a message it refuses for what it carries (a ``user_id``
that is not the login: 406; properties larger than a frame: 501) by closing the channel,
or the whole connection, and every message then unanswered gets no answer at all. Taking
that for an outage would publish them all again, the culprit too, and loop. Instead the
unanswered ones become suspects: each is published alone, in order, once more at most, and
the one the broker refuses again is answered ``refused`` (``item.refused`` says why). New
submissions wait meanwhile and go out once the search is done. Every step is a callback or
a timer on the loop, so heartbeats and the other links' traffic keep flowing during it.

**Outage.** Any other close, or ``STALL_TIMEOUT`` seconds with messages unanswered and no
confirm (the clock stops while the broker blocks the link: an alarm is no outage), ends the
window: ``on_outage(why, items)`` gets every item left without an answer, in publish order.
Their state stays ``""``: stored or not is unknown, and the owner decides (a consumer lets
the originals be redelivered, a publisher publishes them again).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..conf import app_settings
from ..core.errors import ConnectionLost, MessageRefused
from . import confirms
from .links import Clock, Timer
from .translate import LOST, describe, refusal
from .wire import Encoded, encode_properties

logger = logging.getLogger("django_rmq_retry.broker")

#: Seconds with messages unanswered and no confirm after which the window is an outage.
STALL_TIMEOUT = 30.0
#: Seconds between two steps of an isolation (a test knob: a search that lasts).
ISOLATION_STEP_PAUSE = 0.0

OnAnswer = Callable[[confirms.Outgoing], None]


class WindowLink(Protocol):
    """What the window needs of a link (``links.Link`` is one)."""

    url: str
    clock: Clock
    blocked: bool

    @property
    def is_open(self) -> bool: ...

    @property
    def frame_max(self) -> int: ...

    def channel(
        self, on_open: Callable[[Any], None], on_close: Callable[[Any, BaseException], None]
    ) -> Any: ...

    def on_blocked(self, listener: Callable[[bool, str], None]) -> None: ...


#: ``relink(on_done)``: open a new link (``on_done(link_or_error)``) after the broker closed
#: the connection over one message (a frame error), so the search can go on.
Relink = Callable[[Callable[[Any], None]], None]


class _Entry:
    __slots__ = ("item", "on_answer", "returned", "wire")

    def __init__(self, item: confirms.Outgoing, on_answer: OnAnswer, wire: Encoded) -> None:
        self.item = item
        self.on_answer = on_answer
        self.wire = wire
        self.returned = False


class ConfirmWindow:
    """Publishes with confirms on ``link`` (see the module docstring).

    ``state`` is ``opening`` (its channel is not open yet: submissions wait), ``normal``,
    ``isolating``, ``outage`` (``why`` says why) or ``closed``. ``unconfirmed`` counts what
    was submitted and has no answer yet; ``on_progress()`` runs after each batch of answers
    (an owner waiting for the window to drain checks it there). ``label`` names the channel
    in log lines ("publishing", "retry copies"). ``cause`` is what made it an outage: pika's
    exception for a channel that closed, the error of a failed relink, ``None`` for a stall
    (an owner tells a refused publish, a 404, from a lost connection by it).
    ``wait_out_alarms``: while the broker blocks the link (a memory or disk alarm) the stall
    clock stops (the consumer's copies wait an alarm out); ``False`` lets it run, for an
    owner whose caller waits and should hear within ``stall_timeout`` (a ``send``).
    """

    def __init__(
        self,
        link: WindowLink,
        *,
        on_outage: Callable[[str, list[confirms.Outgoing]], None],
        on_progress: Callable[[], None] | None = None,
        relink: Relink | None = None,
        label: str = "publishing",
        stall_timeout: float | None = None,
        step_pause: float | None = None,
        max_message_size: int | None = None,
        wait_out_alarms: bool = True,
    ) -> None:
        self.link = link
        self.wait_out_alarms = wait_out_alarms
        self.clock = link.clock
        self.on_outage = on_outage
        self.on_progress = on_progress
        self.relink = relink
        self.label = label
        self.stall_timeout = STALL_TIMEOUT if stall_timeout is None else stall_timeout
        self.step_pause = ISOLATION_STEP_PAUSE if step_pause is None else step_pause
        if max_message_size is None:
            max_message_size = int(app_settings.MAX_MESSAGE_BYTES or 0)
        self.max_message_size = max_message_size
        self.state = "opening"
        self.why = ""
        self.cause: BaseException | None = None
        self._channel: Any = None
        self._ready = False
        self._next_tag = 1
        self._pending: dict[int, _Entry] = {}  # insertion order == tag order
        self._by_message: dict[Any, list[int]] = {}
        self._backlog: collections.deque[_Entry] = collections.deque()
        self._suspects: collections.deque[_Entry] = collections.deque()
        self._stall: Timer | None = None
        self._step: Timer | None = None
        self._last_progress = self.clock.now()
        self._watch(link)
        self._open_channel()

    # The owner's side --------------------------------------------------------------------
    @property
    def unconfirmed(self) -> int:
        return len(self._pending) + len(self._suspects) + len(self._backlog)

    def submit(self, item: confirms.Outgoing, on_answer: OnAnswer) -> None:
        """Publish ``item``; ``on_answer(item)`` runs on the loop once it has its answer.

        Raises ``MessageRefused`` (nothing sent, ``item`` marked refused) for a message the
        broker would refuse for what it carries (``confirms.early_refusal``), and
        ``ConnectionLost`` once the window is an outage or closed."""
        if self.state in ("outage", "closed"):
            raise ConnectionLost(f"the {self.label} channel is unusable: {self.why}")
        wire = item.wire
        if wire is None:
            wire = Encoded(encode_properties(item.properties), item.message_id)
        why = confirms.early_refusal(
            item.body,
            wire,
            login=self._login,
            frame_max=self.link.frame_max,
            max_message_size=self.max_message_size,
        )
        if why:
            item.refuse(why)
            raise MessageRefused(why, item.message_id)
        item.state = ""
        item.returned = False
        entry = _Entry(item, on_answer, wire)
        if self.state == "normal" and self._ready:
            try:
                self._write(entry)
            except Exception as exc:  # pika cannot write it (a name over 255 bytes...)
                item.refuse(f"pika cannot publish it: {exc!r}")
                raise MessageRefused(item.refused, item.message_id) from exc
        else:
            self._backlog.append(entry)

    def close(self) -> list[confirms.Outgoing]:
        """Close the window's channel without waiting; returns what had no answer (their
        callbacks never run: stored or not is unknown)."""
        if self.state == "closed":
            return []
        self.state = "closed"
        self.why = "closed"
        return self._abandon()

    # Writing -----------------------------------------------------------------------------
    def _write(self, entry: _Entry) -> None:
        tag = self._next_tag
        self._next_tag += 1
        if not self._pending:
            self._last_progress = self.clock.now()  # the stall clock starts with a wait
        self._pending[tag] = entry
        item = entry.item
        self._by_message.setdefault(item.message_id, []).append(tag)
        self._arm_stall()
        try:
            self._channel.basic_publish(
                item.exchange, item.routing_key, item.body, entry.wire, mandatory=True
            )
        except LOST:
            pass  # the channel is going: its close callback decides what comes of this one
        except Exception:
            # pika marshals before it writes: nothing reached the broker, the tag is unused.
            self._forget(tag, entry)
            self._next_tag -= 1
            raise

    def _forget(self, tag: int, entry: _Entry) -> None:
        del self._pending[tag]
        same = self._by_message.get(entry.item.message_id)
        if same is not None:
            same.remove(tag)
            if not same:
                del self._by_message[entry.item.message_id]

    # The channel -------------------------------------------------------------------------
    def _open_channel(self) -> None:
        self._ready = False
        self._next_tag = 1
        self._last_progress = self.clock.now()  # a channel that never opens is a stall
        self._arm_stall()
        self._channel = self.link.channel(self._opened, self._closed)

    def _opened(self, channel: Any) -> None:
        if channel is not self._channel:
            return
        if self.state in ("outage", "closed"):
            with contextlib.suppress(*LOST):
                channel.close()
            return
        channel.add_on_return_callback(self._on_return)
        # Publishes need not wait for confirm.select-ok: the broker handles it before any
        # later publish on this channel, so delivery tags still start at 1.
        channel.confirm_delivery(ack_nack_callback=functools.partial(self._on_confirm, channel))
        self._ready = True
        self._last_progress = self.clock.now()
        if self.state == "isolating":
            self._schedule_step()
        else:
            self.state = "normal"
            self._flush_backlog()

    def _closed(self, channel: Any, reason: BaseException) -> None:
        if channel is not self._channel:
            return  # one we left behind
        self._channel = None
        self._ready = False
        if self.state in ("outage", "closed"):
            return
        why = refusal(reason)
        if why is None or not self._pending:  # (a refusal of nothing in flight: not ours)
            self._outage(f"the {self.label} channel closed: {describe(reason)}", reason)
            return
        if self.state == "isolating":
            # Alone on the channel: this suspect is the one the broker refuses.
            ((tag, entry),) = self._pending.items()
            self._forget(tag, entry)
            self._refuse(entry, why)
            if self.state != "isolating":
                return  # its owner closed the window meanwhile
        else:
            self._suspects.extend(self._pending.values())
            self._pending.clear()
            self._by_message.clear()
            self.state = "isolating"
            logger.warning(
                "RabbitMQ closed the %s %s over one message (%s); publishing the %d "
                "message(s) it left without an answer one at a time to find it",
                self.label,
                "channel" if self.link.is_open else "connection",
                why,
                len(self._suspects),
            )
        self._reopen(why)

    def _reopen(self, why: str) -> None:
        if self.link.is_open:
            self._open_channel()
        elif self.relink is None:
            self._outage(f"RabbitMQ closed the {self.label} connection: {why}")
        else:
            self.relink(self._relinked)

    def _relinked(self, link: Any) -> None:
        if self.state in ("outage", "closed"):
            return
        if isinstance(link, Exception):
            self._outage(str(link), link)
            return
        self.link = link
        self.clock = link.clock
        self._watch(link)
        self._open_channel()

    def _watch(self, link: WindowLink) -> None:
        self._login = confirms.login_of(link.url)
        link.on_blocked(functools.partial(self._blocked, link))

    # Answers -----------------------------------------------------------------------------
    def _on_confirm(self, channel: Any, frame: Any) -> None:
        if channel is not self._channel:
            return
        method = frame.method
        tags = confirms.confirmed_tags(self._pending, method.delivery_tag, method.multiple)
        acked = method.NAME == "Basic.Ack"
        self._last_progress = self.clock.now()
        answered = []
        for tag in tags:  # all taken out first: an answer's callback may close the window
            entry = self._pending[tag]
            self._forget(tag, entry)
            entry.item.state = "ack" if acked else "nack"
            entry.item.returned = entry.returned
            answered.append(entry)
        for entry in answered:
            entry.on_answer(entry.item)
        if self.state == "isolating" and not self._pending:
            self._schedule_step()
        if self.on_progress is not None:
            self.on_progress()

    def _on_return(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        if channel is not self._channel:
            return
        for tag in self._by_message.get(properties.message_id, ()):
            entry = self._pending[tag]
            item = entry.item
            if (
                not entry.returned
                and item.exchange == method.exchange
                and item.routing_key == method.routing_key
                and item.body == body
            ):
                entry.returned = True
                return
        logger.error("a returned message (id %r) matches no pending publish", properties.message_id)

    def _refuse(self, entry: _Entry, why: str) -> None:
        item = entry.item
        item.refuse(why)
        logger.error(
            "the broker refuses message %r to %r (routing key %r): %s",
            item.message_id,
            item.exchange,
            item.routing_key,
            why,
        )
        entry.on_answer(item)
        if self.on_progress is not None:
            self.on_progress()

    # Isolation ---------------------------------------------------------------------------
    def _schedule_step(self) -> None:
        if self._step is None:
            # A timer even for no pause: never a publish from inside pika's frame callback.
            self._step = self.clock.call_later(self.step_pause, self._next_step)

    def _next_step(self) -> None:
        self._step = None
        if self.state != "isolating" or not self._ready or self._pending:
            return
        if self._suspects:
            self._write(self._suspects.popleft())
            return
        self.state = "normal"
        logger.info("the %s channel publishes again after its refused message", self.label)
        self._flush_backlog()

    def _flush_backlog(self) -> None:
        while self._backlog and self.state == "normal" and self._ready:
            entry = self._backlog.popleft()
            try:
                self._write(entry)
            except Exception as exc:  # as submit() would have raised: nothing was sent
                self._refuse(entry, f"pika cannot publish it: {exc!r}")

    # Stalls and outages ------------------------------------------------------------------
    def _arm_stall(self) -> None:
        if self._stall is None:
            self._stall = self.clock.call_later(self.stall_timeout, self._check_stall)

    def _check_stall(self) -> None:
        self._stall = None
        waiting = bool(self._pending) or not self._ready  # for answers, or for a channel
        if self.state not in ("opening", "normal", "isolating") or not waiting:
            return  # armed again by the next write
        if self.link.blocked and self.wait_out_alarms:  # no confirm is due meanwhile
            self._stall = self.clock.call_later(self.stall_timeout, self._check_stall)
            return
        waited = self.clock.now() - self._last_progress
        if waited >= self.stall_timeout:
            what = "confirm" if self._ready else "open channel"
            self._outage(f"no {what} from the broker in {self.stall_timeout:.0f}s")
        else:
            self._stall = self.clock.call_later(self.stall_timeout - waited, self._check_stall)

    def _blocked(self, link: WindowLink, blocked: bool, _why: str) -> None:
        if link is self.link and not blocked:
            self._last_progress = self.clock.now()  # the stall clock starts over

    def _outage(self, why: str, cause: BaseException | None = None) -> None:
        self.state = "outage"
        self.why = why
        self.cause = cause
        unanswered = self._abandon()
        self.on_outage(why, unanswered)

    def _abandon(self) -> list[confirms.Outgoing]:
        for timer in (self._stall, self._step):
            if timer is not None:
                timer.cancel()
        self._stall = self._step = None
        entries = [*self._pending.values(), *self._suspects, *self._backlog]
        self._pending.clear()
        self._by_message.clear()
        self._suspects.clear()
        self._backlog.clear()
        channel, self._channel, self._ready = self._channel, None, False
        if channel is not None and channel.is_open:
            with contextlib.suppress(*LOST):
                channel.close()
        return [entry.item for entry in entries]


__all__ = ["ISOLATION_STEP_PAUSE", "STALL_TIMEOUT", "ConfirmWindow", "WindowLink"]
