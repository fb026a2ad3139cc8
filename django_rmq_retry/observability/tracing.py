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
  requeued messages' traces. A span is an error only when the message is parked: an attempt that fails and a
  later one succeeds pages nobody (its exception is recorded as an event).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..core.message import Message
from ..core.names import Names

SYSTEM = "rabbitmq"
#: Messages a requeue span links to at most (the SDK keeps 128 links by default).
MAX_REQUEUE_LINKS = 128
_W3C = TraceContextTextMapPropagator()


class Tracing:
    def __init__(self, names: Names) -> None:
        self.exchange = names.work_exchange
        # Once: get_tracer per span cost more than the span (a proxy until the project
        # sets its provider, which it then follows).
        self.tracer = trace.get_tracer("django_rmq_retry")
        #: Our header with the previous attempt's span (a W3C ``traceparent`` value).
        self.prev_header = names.header("prev-span")

    @contextlib.contextmanager
    def sending(
        self,
        routing_key: str,
        headers: MutableMapping[str, Any],
        outbox: bool,
        count: int = 1,
        properties: MutableMapping[str, Any] | None = None,
    ) -> Iterator[None]:
        destination = f"{self.exchange}:{routing_key}"
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": destination,
            "messaging.rabbitmq.destination.routing_key": routing_key,
        }
        if count > 1:
            attributes["messaging.batch.message_count"] = count
        if properties is not None:
            import uuid

            # The id the publisher would give it, given now so the span can name it.
            message_id = properties.setdefault("message_id", uuid.uuid4().hex)
            attributes["messaging.message.id"] = str(message_id)
            if properties.get("correlation_id"):
                attributes["messaging.message.conversation_id"] = str(properties["correlation_id"])
        if outbox:
            attributes["django_rmq_retry.outbox"] = True
        with self.tracer.start_as_current_span(
            f"send {destination}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            propagate.inject(headers)
            yield

    def start(self, message: Message) -> tuple[Any, Any]:
        """Start the attempt's process span and make it current on this (receiver) thread."""
        headers = message.headers
        producer = trace.get_current_span(propagate.extract(headers)).get_span_context()
        previous = None
        value = headers.get(self.prev_header)
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if isinstance(value, str):
            previous = trace.get_current_span(
                _W3C.extract({"traceparent": value})
            ).get_span_context()
        # The producer's link carries no attributes (it is also the parent: attributes on
        # each of a message's links cost ~10 µs per span); the previous attempt's says so.
        links = []
        if producer.is_valid:
            links.append(Link(producer))
        if previous is not None and previous.is_valid:
            links.append(
                Link(
                    previous,
                    {
                        "django_rmq_retry.link": "previous_attempt",
                        "django_rmq_retry.attempt": message.attempt - 1,
                    },
                )
            )
        parent = producer if producer.is_valid else previous
        parent_context = (
            trace.set_span_in_context(trace.NonRecordingSpan(parent))
            if parent is not None and parent.is_valid
            else context.Context()
        )
        destination = f"{message.exchange}:{message.routing_key}:{message.queue}"
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": destination,
            "messaging.rabbitmq.destination.routing_key": message.routing_key,
            "django_rmq_retry.receiver": message.receiver,
            "django_rmq_retry.attempt": message.attempt,
        }
        if message.message_id:
            attributes["messaging.message.id"] = str(message.message_id)
        if message.correlation_id:
            attributes["messaging.message.conversation_id"] = str(message.correlation_id)
        if message.requeued:
            attributes["django_rmq_retry.requeued"] = message.requeued
        span = self.tracer.start_span(
            f"process {destination}",
            context=parent_context,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        token = context.attach(trace.set_span_in_context(span))
        return span, token

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

    def retry_copy(self, headers: MutableMapping[str, Any]) -> None:
        """The current attempt's span, for the next attempt to link to."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        if "traceparent" in carrier:
            headers[self.prev_header] = carrier["traceparent"]

    def end(self, started: tuple[Any, Any], error: BaseException | None, action: Any) -> None:
        span, token = started
        try:
            if error is not None:
                span.record_exception(error)  # an event: not an error unless parked
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
                span.set_attribute("django_rmq_retry.outcome", "park")
                span.set_attribute("error.type", request.error_type or request.reason)
                span.set_status(StatusCode.ERROR, f"parked: {request.reason}")
            else:
                span.set_attribute("django_rmq_retry.outcome", "ack")
        finally:
            span.end()
            context.detach(token)
