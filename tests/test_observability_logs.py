"""Structured logs: every record about a message carries its fields as ``extra``; a
receiver's own records get them from ``MessageFields`` (a real consumer, a real broker)."""

from __future__ import annotations

import logging

import pytest
from django.core.management import call_command

from django_rmq_retry import Topic, receiver
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.observability.logs import MessageFields

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

TRACE = "4bf92f3577b34da6a3ce929d0ef4e736"
FIELDS = ("receiver", "message_id", "attempt", "queue", "trace_id")


def test_log_records_about_a_message_carry_its_fields(registry_snapshot, rmq, caplog):
    topic = Topic("test.logs")
    app_log = logging.getLogger("tests.logs.receiver")

    @receiver(topic, retry={"max_attempts": 2, "initial_delay": 0.1, "jitter": "none"})
    def noisy(message, **kwargs):
        app_log.warning("charging %s", message.body["id"])
        raise ValueError("card declined")

    call_command("rmq_consume", setup_only=True, verbosity=0)
    topic.send(
        {"id": 7}, message_id="m-7", headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
    )
    caplog.handler.addFilter(MessageFields())
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.WARNING, logger="django_rmq_retry")  # (rmq_consume may set it)
    (noisy_rec,) = [r for r in _receivers() if r.name.endswith(".noisy")]
    Consumer([noisy_rec], max_messages=2, max_idle_time=60, relay=False).run()

    queue = noisy_rec.queue_name(rmq.prefix)
    about = [r for r in caplog.records if getattr(r, "message_id", None) == "m-7"]
    kinds = {
        "receiver's own": [r for r in about if r.name == "tests.logs.receiver"],
        "retry": [r for r in about if r.getMessage().startswith("retry ")],
        "park": [r for r in about if r.getMessage().startswith("parked ")],
    }
    for kind, records in kinds.items():
        assert records, (kind, [r.getMessage() for r in caplog.records])
        for r in records:
            assert r.receiver == noisy_rec.name, kind
            assert r.queue == queue, kind
            assert r.trace_id == TRACE, kind
    assert [r.attempt for r in kinds["receiver's own"]] == [1, 2]
    assert [r.attempt for r in kinds["retry"]] == [1]
    assert [r.attempt for r in kinds["park"]] == [2]
    # Outside a receiver the filter adds nothing (or None with defaults=True).
    other = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", (), None)
    assert MessageFields().filter(other) and not hasattr(other, "receiver")
    assert MessageFields(defaults=True).filter(other)
    assert all(getattr(other, f) is None for f in FIELDS)


def _receivers():
    from django_rmq_retry.registry import default_registry

    return default_registry.all()
