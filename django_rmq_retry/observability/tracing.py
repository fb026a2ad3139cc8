"""OpenTelemetry traces (the ``otel`` extra: opentelemetry-api only; the SDK is the project's).

Messaging semantic conventions: ``messaging.system=rabbitmq``, span names
``{operation} {destination}``, ``messaging.destination.name`` =
``{exchange}:{routing key}[:{queue}]``.

* ``send``: a PRODUCER span whose W3C trace context goes into the message's headers
  (through the outbox too: the row keeps the headers, the relay publishes them).
* Every receiver attempt: a CONSUMER ``process`` span, a child of the producer's context
  (one trace for the whole story) that also LINKS to it and to the previous attempt's span
  (carried in our ``<prefix>-prev-span`` header on the retry copy; that link's attribute
  ``django_rmq_retry.link`` is ``previous_attempt``), with the attempt number.
  The span is current while the receiver runs: its own spans and log lines belong to it.
* The decision is an event on that span: ``retry`` (with its delay), ``park`` (with its
  reason). An operator's requeue is a ``requeue`` span naming the user, linked to the
  requeued messages' traces. A span is an error only when the message is parked: an attempt
  that fails and a later one succeeds pages nobody (its exception is recorded as an event).

What a span costs the consumer: the SDK's own price for a recorded span, and little of
ours (``bench/obs_cost.py`` shows the two apart). The attributes a sampler may look at
(``messaging.system``, the operation type, the destination) are given when a span starts;
the rest, the decision's events and the exception's (its traceback formatted once per
frame, ``core.failure``) only when the span records (``span.is_recording()``): a span a
ratio sampler drops costs the SDK's decision and a context attached while the receiver
runs, so that its own spans follow the same decision and its log lines carry the trace id.
A message without a trace context is not handed to the propagator at all.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..core.failure import error_text, error_type_name, traceback_text
from ..core.message import Message
from ..core.names import Names
from ..hooks import SendEvent
from .observer import Part

SYSTEM = "rabbitmq"
#: Messages a requeue span links to at most (the SDK keeps 128 links by default).
MAX_REQUEUE_LINKS = 128
_W3C = TraceContextTextMapPropagator()
#: The parent of a span whose message carries no trace context: a new trace.
_ROOT = context.Context()


class Tracing(Part):
    def __init__(self, names: Names) -> None:
        self.exchange = names.work_exchange
        # Once: get_tracer per span cost more than the span (a proxy until the project
        # sets its provider, which it then follows).
        self.tracer = trace.get_tracer("django_rmq_retry")
        #: Our header with the previous attempt's span (a W3C ``traceparent`` value).
        self.prev_header = names.header("prev-span")
        #: The project's propagator and the headers it reads (looked up again if it changes).
        self._textmap: Any = None
        self._fields: frozenset[str] = frozenset()

    # Sending ----------------------------------------------------------------------------------
    def send_started(self, out: SendEvent) -> Any:
        destination = f"{self.exchange}:{out.routing_key}"
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": destination,
        }
        if out.count > 1:
            attributes["messaging.batch.message_count"] = out.count
        span = self.tracer.start_span(
            f"send {destination}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        if span.is_recording():
            more: dict[str, Any] = {
                "messaging.operation.name": "send",
                "messaging.rabbitmq.destination.routing_key": out.routing_key,
            }
            properties = out.properties
            if properties is not None:
                import uuid

                # The id the publisher would give it, given now so the span can name it.
                message_id = properties.setdefault("message_id", uuid.uuid4().hex)
                more["messaging.message.id"] = str(message_id)
                if properties.get("correlation_id"):
                    more["messaging.message.conversation_id"] = str(properties["correlation_id"])
            if out.outbox:
                more["django_rmq_retry.outbox"] = True
            span.set_attributes(more)
        token = context.attach(trace.set_span_in_context(span))
        # Also when not recorded: the consumer's span follows this one's sampling decision.
        propagate.inject(out.headers)
        return span, token

    def send_ended(self, token: Any, error: BaseException | None) -> None:
        span, attached = token
        try:
            if error is not None and span.is_recording():
                span.record_exception(error)
                span.set_attribute("error.type", error_type_name(error))
                span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        finally:
            span.end()
            context.detach(attached)

    # Receiver attempts --------------------------------------------------------------------------
    def _producer(self, headers: dict[str, Any]) -> SpanContext | None:
        """The producer's span context, if the message carries one the project's propagator
        reads (a message without any of its headers is not handed to it)."""
        textmap = propagate.get_global_textmap()
        if textmap is not self._textmap:
            self._textmap, self._fields = textmap, frozenset(textmap.fields)
        if self._fields.isdisjoint(headers):
            return None
        found = trace.get_current_span(textmap.extract(headers)).get_span_context()
        return found if found.is_valid else None

    def _previous(self, headers: dict[str, Any]) -> SpanContext | None:
        """The previous attempt's span context (our header), if any."""
        value = headers.get(self.prev_header)
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if not isinstance(value, str):
            return None
        found = trace.get_current_span(_W3C.extract({"traceparent": value})).get_span_context()
        return found if found.is_valid else None

    def attempt_started(self, message: Message, now: int = 0) -> Any:
        """Start the attempt's process span and make it current on this (receiver) thread."""
        headers = message.headers
        producer = self._producer(headers) if headers else None
        previous = self._previous(headers) if self.prev_header in headers else None
        # The producer's link carries no attributes (it is also the parent, and the SDK
        # copies a link's attributes for every span); the previous attempt's says so.
        links = []
        if producer is not None:
            links.append(Link(producer))
        if previous is not None:
            links.append(
                Link(
                    previous,
                    {
                        "django_rmq_retry.link": "previous_attempt",
                        "django_rmq_retry.attempt": message.attempt - 1,
                    },
                )
            )
        parent = producer or previous
        destination = f"{message.exchange}:{message.routing_key}:{message.queue}"
        span = self.tracer.start_span(
            f"process {destination}",
            context=_ROOT
            if parent is None
            else trace.set_span_in_context(trace.NonRecordingSpan(parent)),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": destination,
            },
            links=links,
            start_time=now or None,
        )
        if span.is_recording():
            more: dict[str, Any] = {
                "messaging.operation.name": "process",
                "messaging.rabbitmq.destination.routing_key": message.routing_key,
                "django_rmq_retry.receiver": message.receiver,
                "django_rmq_retry.attempt": message.attempt,
            }
            if message.message_id:
                more["messaging.message.id"] = str(message.message_id)
            if message.correlation_id:
                more["messaging.message.conversation_id"] = str(message.correlation_id)
            if message.requeued:
                more["django_rmq_retry.requeued"] = message.requeued
            span.set_attributes(more)
        return span, context.attach(trace.set_span_in_context(span))

    def retry_copy(self, headers: MutableMapping[str, Any]) -> None:
        """The current attempt's span, for the next attempt to link to (a W3C
        ``traceparent`` value, with the sampling decision)."""
        found = trace.get_current_span().get_span_context()
        if found.is_valid:
            headers[self.prev_header] = (
                f"00-{found.trace_id:032x}-{found.span_id:016x}-{found.trace_flags:02x}"
            )

    def attempt_ended(
        self, token: Any, error: BaseException | None, action: Any, now: int = 0, took: int = 0
    ) -> None:
        span, attached = token
        try:
            if span.is_recording():
                decided(span, error, action)
        finally:
            span.end(end_time=now or None)
            context.detach(attached)

    def requeued(self, parked_ids: list[int], user: str, mode: str) -> None:
        """An operator requeued parked rows (``message_requeued``, sent once the broker
        confirmed the copies): a span naming who, linked to each message's trace (the
        first ``MAX_REQUEUE_LINKS``). The copies keep the message's ``traceparent``, so
        their next attempt continues the same trace."""
        from ..models import ParkedMessage

        links = []
        rows = ParkedMessage.objects.filter(pk__in=parked_ids[:MAX_REQUEUE_LINKS])
        for headers in rows.values_list("headers", flat=True):
            found = trace.get_current_span(propagate.extract(headers or {})).get_span_context()
            if found.is_valid:
                links.append(Link(found))
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "requeue",
            "messaging.batch.message_count": len(parked_ids),
            "django_rmq_retry.requeue.user": user or "",
            "django_rmq_retry.requeue.mode": mode,
        }
        self.tracer.start_span(
            "requeue", kind=SpanKind.PRODUCER, attributes=attributes, links=links
        ).end()


def decided(span: Any, error: BaseException | None, action: Any) -> None:
    """The attempt's exception (an event: not an error unless parked) and decision."""
    if error is not None:
        # What the SDK's record_exception writes, its traceback formatted once per frame.
        span.add_event(
            "exception",
            {
                "exception.type": error_type_name(error),
                "exception.message": error_text(error),
                "exception.stacktrace": traceback_text(error),
            },
        )
    kind = type(action).__name__
    if kind == "PublishRetry":
        delay = action.signal_kwargs.get("delay")
        span.add_event(
            "retry",
            {
                "django_rmq_retry.retry.delay_seconds": float(delay or 0.0),
                "django_rmq_retry.retry.exchange": action.exchange,
            },
        )
        span.set_attribute("django_rmq_retry.outcome", "retry")
    elif kind == "StorePark":
        request = action.request
        span.add_event(
            "park",
            {
                "django_rmq_retry.park.reason": request.reason,
                "django_rmq_retry.park.detail": request.reason_detail[:200],
            },
        )
        span.set_attributes(
            {
                "django_rmq_retry.outcome": "park",
                "error.type": request.error_type or request.reason,
            }
        )
        span.set_status(StatusCode.ERROR, f"parked: {request.reason}")
    else:
        span.set_attribute("django_rmq_retry.outcome", "ack")
