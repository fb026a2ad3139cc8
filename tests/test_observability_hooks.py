"""The observability hooks never raise into the consumer (no broker needed)."""

from __future__ import annotations

import logging

import pytest

from django_rmq_retry.consumer.actions import HANDLED
from django_rmq_retry.core.message import Message
from django_rmq_retry.core.names import Names
from django_rmq_retry.observability.observer import Observer, Part, lateness


class Broken(Part):
    def attempt_started(self, message, now=0):
        raise RuntimeError("exporter down")

    def attempt_ended(self, token, error, action, now=0, took=0):
        raise RuntimeError("exporter down")


class Counting(Part):
    """A part that works: it sees every attempt, and its own token back."""

    def __init__(self):
        self.ended = []

    def attempt_started(self, message, now=0):
        return message.message_id

    def attempt_ended(self, token, error, action, now=0, took=0):
        self.ended.append((token, took >= 0))

    def settled(self, receiver, queue, outcome):
        self.ended.append(outcome)


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
    working = Counting()
    observer = Observer(Names("p"), tracing=Broken(), metrics=working)
    with caplog.at_level(logging.ERROR, logger="django_rmq_retry.observability"):
        for _ in range(3):
            token = observer.attempt_started(message())
            observer.attempt_ended(token, None, HANDLED)
            observer.settled("app.r", "q", "acked")
    # The broken part's attempt_ended is not called for a start that failed; the other
    # part gets its own token back, and the hook it alone implements.
    assert [r.getMessage() for r in caplog.records] == [
        "observability hook attempt_started failed (said once)"
    ]
    assert working.ended == [("m", True), "acked"] * 3


def test_a_hook_no_part_implements_is_the_no_op():
    observer = Observer(Names("p"), metrics=Counting())
    assert "settled" in vars(observer)  # bound at start-up to the one part that has it
    assert "reconnecting" not in vars(observer)  # Hooks' own no-op
    assert observer.send_started(None) is None


def test_lateness_reads_our_due_headers():
    names = Names("p")
    due, due_us = names.header("due"), names.header("due-us")
    now = __import__("time").time()
    assert lateness({}, due, due_us, now) is None
    assert lateness({due: "soon"}, due, due_us, now) is None
    assert lateness({due: int((now - 10) * 1000)}, due, due_us, now) == pytest.approx(10, abs=0.01)
    assert lateness({due_us: int((now - 2) * 1e6)}, due, due_us, now) == pytest.approx(2, abs=1e-3)
