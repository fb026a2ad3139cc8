"""Fewer system calls per message: the frames queued on a connection leave in one ``send``.

pika queues every frame it writes (a publish is three: method, content header, body; an
ack one) and hands each to the socket with a ``send()`` of its own. On a busy loopback
connection those system calls were the publisher's largest cost (about 15 µs each, three
per message, more than marshalling the frames). Our pipelines write a hundred messages
before they run the I/O loop, so the queue holds hundreds of frames each time it drains:
joined, they leave in a few ``send()`` calls.

Only our own connections are changed, one at a time (:func:`join_queued_frames`), never
pika's classes: other pika users in the process (a benchmark's raw twin, a project's own
code) keep pika's behaviour. Joined pieces are capped (``JOIN_LIMIT``) so a big body is not
copied again and again by partial sends. If pika's transport ever stops looking the way
this expects, the connection keeps pika's own writes: slower, never wrong.
"""

from __future__ import annotations

import collections
from typing import Any

#: Bytes joined into one piece at most (a socket buffer's worth; larger frames go alone).
JOIN_LIMIT = 256 * 1024


def join_queued_frames(raw: Any) -> bool:
    """Make the open pika connection ``raw`` send its queued frames joined; True if it does.

    Called once per connection; pika's transport (the object that owns the socket and the
    queue of outgoing frames) lives as long as the connection.
    """
    transport = getattr(getattr(raw, "_impl", None), "_transport", None)
    frames = getattr(transport, "_tx_buffers", None)
    produce = getattr(transport, "_produce", None)
    if not isinstance(frames, collections.deque) or not callable(produce):
        return False

    def produce_joined() -> None:
        if len(frames) > 1:
            _join(frames)
        produce()

    transport._produce = produce_joined  # type: ignore[union-attr]
    return True


def _join(frames: collections.deque[bytes]) -> None:
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
