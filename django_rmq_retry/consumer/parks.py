"""The parking side of the handler: the row a message is parked as, and the retry copy that
cannot go on because it would not fit its frame.

:class:`~.handler.Handler` decides; this module describes what a decision to park must
write (a :class:`~.actions.StorePark` the parking thread commits) for each way a message
gets here: a failed attempt, a verdict before the receiver ran, a message the broker
dead-lettered (quorum delivery limit), a retry copy the broker refused or that cannot fit
the publishing connection's frame limit. It also writes an attempt's record for the
history header, which a retry copy and a parked row carry alike.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings

from ..core import history
from ..core.deadletter import dead_letter_park, last_death
from ..core.envelope import Envelope, read_incoming
from ..core.failure import (
    error_summary,
    error_type_name,
    fingerprint,
    frames_of,
    library_roots,
    traceback_text,
)
from ..core.header_budget import fit_headers, properties_room
from ..core.names import Names
from ..core.outcome import Park, ParkReason
from ..core.topology_plan import QUORUM_DELIVERY_LIMIT
from ..parking import ParkRequest
from .actions import Delivery, StorePark

#: Longest error message kept on a parked row (headers get ``ERROR_HEADER_MAX``).
ROW_ERROR_MAX = 10_000


class Encoded(Protocol):
    """Properties encoded for the wire (``broker.Encoded``): the handler reads their size."""

    data: bytes


class Parks:
    """Describes rows to park and fits retry copies to their frame (see the module
    docstring); ``clock`` is the handler's, so a row's times agree with its copies'."""

    def __init__(self, names: Names, clock: Callable[[], datetime]) -> None:
        self.names = names
        self.clock = clock
        h = names.header
        self._error_header = h("error")
        #: Our optional headers, in the order they go when a copy does not fit its frame.
        #: The attempt history goes first: the least needed to route and count a copy.
        self.history_header = h("history")
        self._droppable = (
            h("error"),
            h("error-type"),
            h("last-failure"),
            h("first-failure"),
        )
        self._host = socket.gethostname()
        self._roots = library_roots()
        self._base_dir = str(getattr(settings, "BASE_DIR", "") or "")

    def park(
        self,
        d: Delivery,
        receiver: str,
        env: Envelope,
        decision: Park,
        *,
        exc: BaseException | None = None,
        start_key: str | None = None,
        took_ms: float = 0.0,
    ) -> StorePark:
        """Describe the row to park (the parking thread writes it)."""
        now = self.clock()
        if exc is not None:
            error_type = error_type_name(exc)
            error_message = error_summary(exc, ROW_ERROR_MAX)
            tb = traceback_text(exc)
            group = fingerprint(
                error_type, frames_of(exc.__traceback__), self._roots, self._base_dir
            )
        else:
            error_type = decision.reason.value
            error_message = decision.detail
            tb = ""
            group = f"{decision.reason.value}: {decision.detail.split(':')[0]}"
        request = ParkRequest(
            receiver=receiver,
            queue=d.queue,
            exchange=env.exchange,
            routing_key=env.routing_key,
            body=d.body,
            properties=d.properties,
            reason=decision.reason.value,
            reason_detail=decision.detail,
            attempts=env.attempt,
            redelivered=d.redelivered,
            error_type=error_type,
            error_message=error_message,
            traceback=tb,
            fingerprint=group,
            first_failure_at=env.first_failure or now,
            last_failure_at=now,
            attempt_record=(
                self.attempt_record(env, exc, now, took_ms, None) if exc is not None else ""
            ),
            field_errors=decision.field_errors,
        )
        log_line = (
            f"parked {receiver} message {d.properties.get('message_id')} after {env.attempt} "
            f"attempt(s): {decision.reason.value} ({error_message[:200]})"
        )
        return StorePark(request, start_key, log_line)

    def dead_letter(self, d: Delivery, headers: dict[str, Any]) -> StorePark:
        """A message the broker gave up on (quorum delivery limit): park it where it was."""
        death = last_death(headers)
        queue = death.queue if death else "?"
        exchange, routing_key = (death.exchange, death.routing_key) if death else ("", "")
        env = read_incoming(headers, exchange, routing_key, self.names)
        if queue == self.names.orphan_queue:  # an orphaned retry: it belongs to its target
            queue = env.target or queue
        verdict = dead_letter_park(death, QUORUM_DELIVERY_LIMIT)
        return self.park(
            replace(d, queue=queue), receiver_for_queue(queue, self.names), env, verdict
        )

    def refused_copy(self, d: Delivery, why: str, start_key: str | None) -> StorePark:
        """The broker refuses ``d``'s retry copy for what it carries (publishing it again
        cannot help): park the original now, with the broker's reason, instead of giving it
        back to run its receiver again."""
        headers = d.properties.get("headers") or {}
        env = read_incoming(headers, d.exchange, d.routing_key, self.names)
        receiver = d.receiver.name if d.receiver is not None else d.queue
        detail = f"the broker refuses its retry copy: {why}"
        park = Park(ParkReason.NON_RETRYABLE, detail)
        return self.park(d, receiver, env, park, start_key=start_key)

    def attempt_record(
        self,
        env: Envelope,
        exc: BaseException,
        at: datetime,
        took_ms: float,
        next_delay_s: float | None,
    ) -> str:
        """This attempt for the history header (``core.history``): a few microseconds, the
        frame found as the failure group finds it (``walk_tb``, no source lines read)."""
        what = fingerprint(
            error_type_name(exc), frames_of(exc.__traceback__), self._roots, self._base_dir
        )
        return history.record(env.attempt, at, self._host, os.getpid(), took_ms, what, next_delay_s)

    def fit_to_frame(
        self,
        props: dict[str, Any],
        frame_max: int,
        encode: Callable[[Mapping[str, Any]], Encoded] | None,
    ) -> tuple[dict[str, Any] | None, Any]:
        """A retry copy's properties fitted to the publishing connection's ``frame_max``
        (``core.header_budget``) and their encoded form: ``(None, bytes needed)`` if they
        cannot fit (the handler parks the message then), ``(props, None)`` when copies are
        not measured (no frame limit known, or no ``encode``)."""
        if not frame_max or encode is None:
            return props, None
        wire = encode(props)
        room = properties_room(frame_max)
        if room is None or len(wire.data) <= room:  # nearly always: encoded once, sent as is
            return props, wire

        def size(p: Mapping[str, Any]) -> int:
            return len(encode(p).data)

        fitted = fit_headers(
            props,
            room,
            size,
            error_header=self._error_header,
            droppable=self._droppable,
            drop_first=(self.history_header,),
        )
        if fitted is None:
            optional = {*self._droppable, self.history_header}
            headers = {k: v for k, v in props["headers"].items() if k not in optional}
            return None, size({**props, "headers": headers})
        return fitted, encode(fitted)


def receiver_for_queue(queue: str, names: Names) -> str:
    """The receiver a queue of ours belongs to: its name without our prefix."""
    prefix = names.prefix + "."
    return queue[len(prefix) :] if queue.startswith(prefix) else queue
