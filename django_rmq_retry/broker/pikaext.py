"""What pika lacks and we need: the module that reads pika's internals.

Everything else in ``broker/`` uses pika through its public API, but for the header guard
(``headerguard``: the table decoder of our connections' properties), which says here whether
it is on. Each piece here is
feature-detected on the objects of the running pika (never on a version number) and, where
pika is not shaped as expected, it is off and the caller takes pika's public path: slower,
never wrong. :func:`log_features` says once, at the consumer's start-up, which are on
(``pika 1.4.4: frame joining on, ...``), so production learns when a pika upgrade turned
one off. Tested on the oldest and the newest pika ``pyproject.toml`` allows.

- **frame joining** (a connection's transport: ``_tx_buffers``, ``_produce``): the frames
  queued on one of our connections leave in a few ``send()`` calls, not one per frame.
- **direct publish frames** (a channel's ``_raise_if_not_open``, its connection's
  ``_output_marshaled_frames`` and ``_body_max_length``): a publish's frames written in one
  piece (``frames.publish_frames``: the bytes pika writes).
- **two-connection wait** (the I/O loop's ``_poller._fd_events`` and
  ``_get_remaining_interval``): one thread waits on the input of two blocking connections at
  once (``Connection.pump_with``); off, it pumps each in turn with a short time limit.
- **confirms in flight** (``BlockingChannel._impl``): the asynchronous channel under a
  blocking one, whose publishes do not wait for their confirm (``confirms``). pika offers
  no public way; without it, :class:`PikaUnsupported` says which pika to install.
- **close reason** (a channel's ``_closing_reason``): why the broker closed a channel,
  for the log line that says so; off, "closed".
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import pika

from .frames import publish_frames

logger = logging.getLogger("django_rmq_retry.broker")

#: Bytes joined into one piece at most (a socket buffer's worth; larger frames go alone).
JOIN_LIMIT = 256 * 1024

#: Each optional piece and whether the running pika allows it (None: not tried yet).
_FEATURES: dict[str, bool | None] = {
    "header guard": None,
    "frame joining": None,
    "direct publish frames": None,
    "two-connection wait": None,
}
_lock = threading.Lock()
_logged = False


class PikaUnsupported(RuntimeError):
    """The installed pika lacks something we cannot do without."""


def note(feature: str, on: bool) -> bool:
    """Record whether ``feature`` is on in this process (once off, it says off)."""
    with _lock:
        if _FEATURES.get(feature) is None or not on:  # once off, it says off
            _FEATURES[feature] = on
    return on


def pika_version() -> str:
    return str(getattr(pika, "__version__", "?"))


def features() -> dict[str, bool | None]:
    """Which optional pieces the running pika allows (None: not used yet in this process)."""
    with _lock:
        return dict(_FEATURES)


def log_features() -> None:
    """Log once per process which pieces are on (the consumer calls it at start-up)."""
    global _logged
    with _lock:
        if _logged:
            return
        _logged = True
        seen = dict(_FEATURES)
    parts = [f"{name} {'?' if on is None else 'on' if on else 'off'}" for name, on in seen.items()]
    level = logging.WARNING if False in seen.values() else logging.INFO
    logger.log(level, "pika %s: %s", pika_version(), ", ".join(parts))


# Frame joining ----------------------------------------------------------------------------


def join_queued_frames(raw: pika.BlockingConnection) -> bool:
    """Make the open connection ``raw`` send its queued frames joined; True if it does.

    pika queues every frame it writes (a publish is three, an ack one) and hands each to
    the socket with a ``send()`` of its own: on a busy connection those system calls cost
    more than marshalling the frames. Our pipelines write many messages before they run the
    I/O loop, so the queue holds hundreds of frames each time it drains: joined into
    pieces of up to ``JOIN_LIMIT``, they leave in a few calls. Only this connection's
    transport is changed, never pika's classes.
    """
    transport = getattr(getattr(raw, "_impl", None), "_transport", None)
    frames = getattr(transport, "_tx_buffers", None)
    produce = getattr(transport, "_produce", None)
    if not isinstance(frames, collections.deque) or not callable(produce):
        return note("frame joining", False)

    def produce_joined() -> None:
        if len(frames) > 1:
            join(frames)
        produce()

    transport._produce = produce_joined  # type: ignore[union-attr]
    return note("frame joining", True)


def join(frames: collections.deque[bytes]) -> None:
    """Rewrite ``frames`` in place as the same bytes in pieces of up to ``JOIN_LIMIT``."""
    pieces: list[bytes] = []
    part: list[bytes] = []
    size = 0
    for frame in frames:
        if part and size + len(frame) > JOIN_LIMIT:
            pieces.append(b"".join(part))
            part, size = [], 0
        part.append(frame)
        size += len(frame)
    if part:
        pieces.append(b"".join(part))
    frames.clear()
    frames.extend(pieces)


# Direct publish frames --------------------------------------------------------------------


class FrameWriter:
    """Writes a publish's frames (``frames.publish_frames``) to an asynchronous pika channel
    in one piece, as pika would. ``usable`` is False when pika's channel or connection is
    not shaped as this expects: then the caller publishes through pika."""

    def __init__(self, channel: Any) -> None:
        connection = getattr(channel, "connection", None)
        self._check = getattr(channel, "_raise_if_not_open", None)
        self._output = getattr(connection, "_output_marshaled_frames", None)
        body_max = getattr(connection, "_body_max_length", None)
        number = getattr(channel, "channel_number", None)
        self.usable = note(
            "direct publish frames",
            callable(self._check)
            and callable(self._output)
            and isinstance(body_max, int)
            and isinstance(number, int),
        )
        self._connection = connection
        self.channel_number: int = number if isinstance(number, int) else 0

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: bytes, mandatory: bool
    ) -> bool:
        """Write the publish; False if it must take pika's path instead (nothing written)."""
        frames = publish_frames(
            self.channel_number,
            exchange,
            routing_key,
            mandatory,
            properties,
            body,
            self._connection._body_max_length,  # type: ignore[union-attr]
        )
        if frames is None:
            return False
        self._check()  # type: ignore[misc]  # a closed channel raises as pika's publish does
        self._output([frames])  # type: ignore[misc]
        return True


# Two-connection wait ----------------------------------------------------------------------


def idle_state(raw: pika.BlockingConnection) -> tuple[list[int], float | None] | None:
    """What ``raw``'s I/O loop would wait on: the file descriptors it reads (its socket,
    its thread-safe wake-up) and the seconds to its next callback or timer (None: none);
    None if this pika keeps them elsewhere."""
    try:
        from pika.adapters.select_connection import PollEvents

        ioloop = raw._impl.ioloop  # type: ignore[attr-defined]
        fds = list(ioloop._poller._fd_events[PollEvents.READ])
        due = ioloop._get_remaining_interval()
        if not all(isinstance(fd, int) for fd in fds) or not (
            due is None or isinstance(due, int | float)
        ):
            raise TypeError(due)
    except (AttributeError, KeyError, TypeError, ImportError):
        note("two-connection wait", False)
        return None
    note("two-connection wait", True)
    return fds, due


# Confirms in flight -----------------------------------------------------------------------


def async_channel(channel: Any) -> Any:
    """The asynchronous pika channel under the blocking channel ``channel``."""
    impl = getattr(channel, "_impl", None)
    needed = ("basic_publish", "confirm_delivery", "add_on_return_callback", "close")
    if impl is None or not all(callable(getattr(impl, name, None)) for name in needed):
        raise PikaUnsupported(
            f"pika {pika_version()} has no asynchronous channel under its blocking one; "
            "install a pika version pyproject.toml allows"
        )
    return impl


# Close reason -----------------------------------------------------------------------------


def close_reason(channel: Any) -> BaseException | None:
    """Why the broker (or pika) closed ``channel``, if pika kept it."""
    reason = getattr(channel, "_closing_reason", None)
    return reason if isinstance(reason, BaseException) else None
