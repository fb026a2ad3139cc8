"""An ``async def`` receiver that obeys its message body as ``consumers.behave`` does
(``sleep`` awaits instead of blocking). Imported by the async tests, and by a consumer
child started with ``RMQ_TEST_ASYNC=1`` (``consumers`` imports it then)."""

import asyncio
import os

from django_rmq_retry import Reject, Retry, Topic, receiver

from .consumers import Boom, _log

aio_topic = Topic("test.async")
#: What each attempt saw as its current trace span, (attempt, span id), for a message whose
#: body asks (``"trace": true``; the tracing tests run this receiver in their own process).
seen_spans: list[tuple[int, int]] = []


@receiver(
    aio_topic,
    retry={"max_attempts": 3, "initial_delay": 0.1, "multiplier": 2, "jitter": "none"},
)
async def delta(message, **kwargs):
    _log("start", "delta", message)
    body = message.body if isinstance(message.body, dict) else {}
    if body.get("trace"):
        from opentelemetry import trace

        await asyncio.sleep(0)  # the span stays current across an await
        seen_spans.append((message.attempt, trace.get_current_span().get_span_context().span_id))
    if body.get("sleep"):
        await asyncio.sleep(float(body["sleep"]))
    if (
        body.get("exit")
        and message.attempt <= int(body["exit"])
        and os.environ.get("RMQ_TEST_ALLOW_EXIT")
    ):
        os._exit(42)
    if body.get("reject"):
        raise Reject(f"rejected {body.get('id')}")
    fail = body.get("fail", 0)
    if fail == "always" or (isinstance(fail, int) and message.attempt <= fail):
        if body.get("retry_delay") is not None:
            raise Retry(delay=float(body["retry_delay"]))
        raise Boom(f"boom {body.get('id')} attempt {message.attempt}")
    _log("done", "delta", message)
