"""The observability hooks never raise into the consumer (no broker needed)."""

from __future__ import annotations

import logging

from django_rmq_retry.consumer.actions import HANDLED
from django_rmq_retry.core.message import Message
from django_rmq_retry.core.names import Names
from django_rmq_retry.observability.observer import Observer, lateness


class Broken:
    def start(self, message):
        raise RuntimeError("exporter down")

    def end(self, span, error, action):
        raise RuntimeError("exporter down")


def message(**kw) -> Message:
    values = dict(
        body={},
        raw=b"{}",
        headers={},
        routing_key="k",
        exchange="x",
        queue="q",
        receiver="app.r",
        message_id="m",
        correlation_id=None,
        content_type=None,
        timestamp=None,
        attempt=1,
        redelivered=False,
    )
    values.update(kw)
    return Message(**values)


def test_a_failing_part_is_logged_once_and_never_raises(caplog):
    observer = Observer(Names("p"), tracing=Broken())
    with caplog.at_level(logging.ERROR, logger="django_rmq_retry.observability"):
        for _ in range(3):
            token = observer.attempt_started(message())
            assert token is None
            observer.attempt_ended(token, None, HANDLED)
    assert [r.getMessage() for r in caplog.records] == [
        "observability hook attempt_started failed (said once)"
    ]


def test_lateness_reads_our_due_headers():
    names = Names("p")
    due, due_us = names.header("due"), names.header("due-us")
    assert lateness({}, due, due_us) is None
    assert lateness({due: "soon"}, due, due_us) is None
    assert 9 < lateness({due: int((__import__("time").time() - 10) * 1000)}, due, due_us) < 60
