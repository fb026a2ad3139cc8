"""One publisher per thread, as Django's database connections.

A thread waiting out nack pauses on a full queue, a connect to a node that does not
answer, a relay round or a requeue holds up no other thread's ``send``: each thread
publishes on a connection of its own (:func:`get_publisher`). No lock is held across I/O;
a thread's publisher is closed when the thread ends, every one at interpreter exit, and
none made before a fork is closed by the child (its socket is the parent's).
``django_rmq_retry.testing`` installs one in-memory publisher for every thread
(:func:`install`).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any, cast

from .publisher import Publisher

logger = logging.getLogger("django_rmq_retry.publishing.publisher")


class _Slot:
    """A thread's publisher, held in :data:`_local`: when the thread ends its slot is
    dropped, in that thread, and the publisher's connection closed (the broker would log
    "client unexpectedly closed TCP connection" for a socket left to the garbage collector)."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    def __del__(self) -> None:
        try:
            _close_quietly(self.publisher)
        except Exception:  # interpreter shutdown: the module may be half gone
            return


def _close_quietly(publisher: Publisher) -> None:
    """Close ``publisher`` unless it was made before a fork (its socket is the parent's)."""
    if publisher.pid != os.getpid():
        return
    try:
        publisher.close()
    except Exception:  # the broker may be gone already; close quietly
        logger.debug("closing a publisher failed", exc_info=True)


#: This thread's publisher (``_local.slot``).
_local = threading.local()
#: Every thread's publisher, to close at interpreter exit.
_every: weakref.WeakSet[Publisher] = weakref.WeakSet()
#: ``testing``'s in-memory publisher while one is installed: every thread's then.
_installed: Any = None
#: Bumped by :func:`reset_publisher`: a thread's publisher made before is replaced.
_generation = 0
_registry_lock = threading.Lock()  # guards the four above, never held across I/O
_closes_at_exit = False


def get_publisher() -> Publisher:
    """This thread's publisher (created on first use; ``testing`` installs a shared one).

    One per thread, as Django's database connections: a thread's nack pauses, connects and
    long batches never hold up another thread's ``send``.
    """
    global _closes_at_exit
    if _installed is not None:
        return cast(Publisher, _installed)
    slot: _Slot | None = getattr(_local, "slot", None)
    if slot is not None and slot.publisher.generation == _generation:
        return slot.publisher
    if slot is not None:  # made before a reset (settings changed): replace it
        _local.slot = None
    publisher = Publisher()
    with _registry_lock:
        publisher.generation = _generation
        _every.add(publisher)
        if not _closes_at_exit:
            atexit.register(_close_at_exit)
            _closes_at_exit = True
    _local.slot = _Slot(publisher)
    return publisher


def _close_at_exit() -> None:
    """Close every thread's publisher connection when the interpreter exits.

    Without it every process that ever published (a web worker, a management command)
    leaves by dropping its sockets, and the broker logs "client unexpectedly closed TCP
    connection" for each. A forked child leaves its parent's connections alone: closing
    them would write on the parent's sockets.
    """
    with _registry_lock:
        publishers = list(_every)
    for publisher in publishers:
        _close_quietly(publisher)


def install(publisher: Any) -> Any:
    """Make ``publisher`` every thread's; returns the one it replaces (or ``None``).

    For ``django_rmq_retry.testing``, whose in-memory broker publishes in place of RabbitMQ.
    """
    global _installed
    with _registry_lock:
        previous, _installed = _installed, publisher
    return previous


def reset_publisher() -> None:
    """Close this thread's publisher and have every other thread replace its own at its
    next publish (tests, settings changes). Another thread's connection is closed by that
    thread, never under its feet."""
    global _generation
    with _registry_lock:
        _generation += 1
    slot: _Slot | None = getattr(_local, "slot", None)
    _local.slot = None
    if slot is not None:
        _close_quietly(slot.publisher)
