"""OpenTelemetry traces of a message across its retries, against the real broker, exported
with the SDK's in-memory exporter."""

from __future__ import annotations

import pytest

from django_rmq_retry.consumer import Consumer
from django_rmq_retry.registry import default_registry
from tests.conftest import read_log
from tests.testapp.events import other

pytest.importorskip("opentelemetry.sdk")
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans():
    """The process-wide tracer provider (set once: OpenTelemetry allows one) with the
    in-memory exporter, emptied for this test; tracing hooks installed."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    from django_rmq_retry import observability

    observability.enable(metrics=False, tracing=True, liveness_timeout=60)
    try:
        yield _EXPORTER
    finally:
        observability.disable()


def run_consumer(rmq, done: int) -> None:
    gamma = default_registry.find("gamma", rmq.prefix)
    Consumer([gamma], max_messages=done, max_idle_time=60, relay=False).run()


def show(found) -> str:
    lines = []
    for s in found:
        links = [
            (
                format(link.context.span_id, "016x"),
                (link.attributes or {}).get("django_rmq_retry.link"),
            )
            for link in s.links
        ]
        lines.append(
            f"{s.name} kind={s.kind.name} trace={s.context.trace_id:032x} "
            f"span={s.context.span_id:016x} "
            f"parent={format(s.parent.span_id, '016x') if s.parent else None} "
            f"attempt={s.attributes.get('django_rmq_retry.attempt')} "
            f"status={s.status.status_code.name} events={[e.name for e in s.events]} "
            f"links={links}"
        )
    return "\n".join(lines)


def test_a_message_that_failed_twice_then_succeeded_is_one_trace_of_linked_attempts(rmq, spans):
    from django.core.management import call_command

    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": 1, "fail": 2}, correlation_id="order-42")
    run_consumer(rmq, done=3)  # two retried, one handled
    assert [e["attempt"] for e in read_log(rmq.log) if e["event"] == "done"] == [3]

    found = spans.get_finished_spans()
    print(show(found))
    (send,) = [s for s in found if s.kind is SpanKind.PRODUCER]
    process = sorted(
        (s for s in found if s.kind is SpanKind.CONSUMER),
        key=lambda s: s.attributes["django_rmq_retry.attempt"],
    )
    assert [s.attributes["django_rmq_retry.attempt"] for s in process] == [1, 2, 3]
    queue = rmq.queue("gamma")
    destination = f"{rmq.names.work_exchange}:test.other"
    assert send.name == f"send {destination}"
    assert send.attributes["messaging.system"] == "rabbitmq"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.message.conversation_id"] == "order-42"
    message_id = send.attributes["messaging.message.id"]
    trace_id = send.context.trace_id
    previous = None
    for span in process:
        assert span.name == f"process {destination}:{queue}"
        assert span.attributes["messaging.operation.type"] == "process"
        assert span.attributes["messaging.destination.name"] == f"{destination}:{queue}"
        assert span.attributes["messaging.rabbitmq.destination.routing_key"] == "test.other"
        assert span.attributes["messaging.message.id"] == message_id
        assert span.attributes["messaging.message.conversation_id"] == "order-42"
        assert span.context.trace_id == trace_id  # one trace
        assert span.parent is not None and span.parent.span_id == send.context.span_id
        linked = {
            (link.attributes or {}).get("django_rmq_retry.link", "producer"): link.context
            for link in span.links
        }
        assert linked["producer"].span_id == send.context.span_id
        if previous is None:
            assert "previous_attempt" not in linked
        else:
            assert linked["previous_attempt"].span_id == previous.context.span_id
        # Failed attempts that later succeed are no error: nobody gets paged.
        assert span.status.status_code is not StatusCode.ERROR
        previous = span
    assert [e.name for e in process[0].events] == ["exception", "retry"]
    raised = process[0].events[0].attributes
    assert raised["exception.type"] == "tests.testapp.consumers.Boom"
    assert raised["exception.message"] == "boom 1 attempt 1"
    assert raised["exception.stacktrace"].startswith("Traceback (most recent call last):")
    assert raised["exception.stacktrace"].endswith("Boom: boom 1 attempt 1\n")
    assert process[0].events[1].attributes["django_rmq_retry.retry.delay_seconds"] > 0
    assert [e.name for e in process[2].events] == []
    assert process[2].attributes["django_rmq_retry.outcome"] == "ack"


def test_a_parked_message_is_the_one_error(rmq, spans):
    from django.core.management import call_command

    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": 2, "reject": True})
    run_consumer(rmq, done=1)
    found = spans.get_finished_spans()
    print(show(found))
    (process,) = [s for s in found if s.kind is SpanKind.CONSUMER]
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes["error.type"]
    (park,) = [e for e in process.events if e.name == "park"]
    assert park.attributes["django_rmq_retry.park.reason"]

    # An operator requeues it: a span naming who, linked to the message's trace; the
    # requeued copy's attempt continues that trace.
    from django_rmq_retry.models import ParkedMessage
    from django_rmq_retry.parking import requeue

    spans.clear()
    requeue(ParkedMessage.objects.all(), user="alice")
    run_consumer(rmq, done=1)
    found = spans.get_finished_spans()
    print(show(found))
    (requeued,) = [s for s in found if s.name == "requeue"]
    assert requeued.attributes["django_rmq_retry.requeue.user"] == "alice"
    assert [link.context.trace_id for link in requeued.links] == [process.context.trace_id]
    (again,) = [s for s in found if s.kind is SpanKind.CONSUMER]
    assert again.context.trace_id == process.context.trace_id
    assert again.attributes["django_rmq_retry.requeued"] == 1


def test_a_trace_not_sampled_is_followed_but_records_nothing(spans):
    """A message whose producer's span was not sampled (flags 00): the default sampler of
    the SDK (``ParentBased``) follows that decision, so nothing is recorded, yet the
    receiver runs inside that trace and the retry copy carries it on, still unsampled."""
    from django_rmq_retry.conf import current_names
    from django_rmq_retry.consumer.actions import HANDLED
    from django_rmq_retry.hooks import current
    from tests.test_observability_hooks import message as make_message

    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    message = make_message(headers={"traceparent": f"00-{trace_id}-{span_id}-00", "other": 1})
    token = current.attempt_started(message)
    inside = trace.get_current_span()
    assert not inside.is_recording()
    assert format(inside.get_span_context().trace_id, "032x") == trace_id
    copy: dict = {}
    current.retry_copy(copy)
    (value,) = copy.values()
    assert value.startswith(f"00-{trace_id}-") and value.endswith("-00")
    assert list(copy) == [current_names().header("prev-span")]
    current.attempt_ended(token, RuntimeError("boom"), HANDLED)
    assert not trace.get_current_span().get_span_context().is_valid  # detached
    assert spans.get_finished_spans() == ()


def test_an_async_receivers_attempts_are_traced_like_a_plain_ones(
    rmq, spans, registry_snapshot, caplog
):
    """``async def`` receivers: the attempt's span is current in the receiver (on the event
    loop, across an await) and is ended where it was made current, without OpenTelemetry's
    "Failed to detach context" (its context is attached and detached in one context)."""
    import importlib
    import logging

    from django.core.management import call_command

    from tests.testapp import async_consumers

    default_registry.unregister(async_consumers.delta)
    aio = importlib.reload(async_consumers)
    call_command("rmq_consume", setup_only=True, verbosity=0)
    aio.aio_topic.send({"id": 1, "fail": 1, "trace": True})
    with caplog.at_level(logging.ERROR, logger="opentelemetry"):
        call_command("rmq_consume", "delta", max_messages=2, max_idle_time=30, verbosity=0)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")] == []

    found = spans.get_finished_spans()
    print(show(found))
    process = sorted(
        (s for s in found if s.kind is SpanKind.CONSUMER),
        key=lambda s: s.attributes["django_rmq_retry.attempt"],
    )
    assert [s.attributes["django_rmq_retry.attempt"] for s in process] == [1, 2]
    (send,) = [s for s in found if s.kind is SpanKind.PRODUCER]
    assert {s.context.trace_id for s in process} == {send.context.trace_id}
    assert aio.seen_spans == [(1, process[0].context.span_id), (2, process[1].context.span_id)]
    assert [e.name for e in process[0].events] == ["exception", "retry"]
    # Nothing of the attempts stays current in this (the consumer's) thread afterwards.
    assert not trace.get_current_span().get_span_context().is_valid
