"""RabbitMQ 4.3's quorum consumer timeout, against a real 4.3 node (the rabbit43 leg).

A quorum queue whose consumer holds a message past the queue's consumer timeout gets a
``basic.cancel`` from 4.3 (the channel stays open) and the message is delivered again. The
consumer resumes at once; the redelivery never runs beside the run still going
(``consumer/overruns.py``): it stands in for the taken-back delivery and is settled with
its run, and one that keeps being taken back while its run goes on is parked, named.

The timeout is a policy on the test's prefix (``consumer-timeout``, 2 s), on quorum queues.
"""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest
from django.conf import settings
from django.test import override_settings

from django_rmq_retry.models import ParkedMessage
from tests.conftest import rabbitmqctl_cmd, read_log, start_consumer, wait_for
from tests.testapp.events import other

pytestmark = [
    pytest.mark.broker,
    pytest.mark.rabbit43,
    pytest.mark.undeclared,
    pytest.mark.django_db(transaction=True),
]

TIMEOUT_MS = 2000


@pytest.fixture
def quorum_with_timeout(rmq):
    """The test's prefix declared with quorum queues, and a 2 s consumer timeout on them."""
    policy = f"{rmq.prefix}-consumer-timeout"
    subprocess.run(
        rabbitmqctl_cmd(
            "set_policy",
            "-p",
            "/",
            "--apply-to",
            "quorum_queues",
            "--priority",
            "100",
            policy,
            f"^{rmq.prefix}\\.",
            json.dumps({"consumer-timeout": TIMEOUT_MS}),
        ),
        check=True,
        capture_output=True,
    )
    conf = {**settings.RMQ_RETRY, "PREFIX": rmq.prefix, "QUEUE_TYPE": "quorum"}
    with override_settings(RMQ_RETRY=conf):
        rmq.setup()
        try:
            yield rmq
        finally:
            subprocess.run(rabbitmqctl_cmd("clear_policy", "-p", "/", policy), check=False)


def _events(rmq, event: str, id_: object) -> list[dict]:
    return [e for e in read_log(rmq.log) if e["event"] == event and e["id"] == id_]


def _never_overlaps(starts: list[dict], dones: list[dict]) -> bool:
    """Each run of the message ended before the next one started."""
    begins = sorted(s["t"] for s in starts)
    ends = sorted(e["t"] for e in dones)
    return all(
        any(begin <= end <= later for end in ends) for begin, later in itertools.pairwise(begins)
    )


def test_a_timed_out_consumer_resumes_and_the_slow_message_never_runs_twice_at_once(
    quorum_with_timeout,
):
    rmq = quorum_with_timeout
    proc = start_consumer(
        rmq.prefix,
        rmq.log,
        "gamma",
        "--threads",
        "4",
        RMQ_QUEUE_TYPE="quorum",
        RMQ_DELIVERY_LIMIT="50",
    )
    try:
        # 2.25 timeouts long: the broker takes it back twice while it runs, and its run ends
        # 1.5 s before the next take-back would come (its ack is long sent by then).
        other.send({"id": "slow", "sleep": TIMEOUT_MS * 2.25 / 1000})
        assert wait_for(lambda: _events(rmq, "start", "slow"), 60), proc.output()
        for i in range(30):
            other.send({"id": i})
        assert wait_for(lambda: _events(rmq, "done", "slow"), 90), proc.output()
        done = lambda: {e["id"] for e in read_log(rmq.log) if e["event"] == "done"}  # noqa: E731
        assert wait_for(lambda: done() >= {*range(30), "slow"}, 90), proc.output()
        # Sent after the slow one ended: the consumer still consumes (it was resumed).
        other.send({"id": "after"})
        assert wait_for(lambda: _events(rmq, "done", "after"), 60), proc.output()
        assert wait_for(lambda: rmq.depth(rmq.queue("gamma")) == 0, 60)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert "RabbitMQ took it back and delivered it again" in out, out
    starts, dones = _events(rmq, "start", "slow"), _events(rmq, "done", "slow")
    assert len(starts) == 1, (starts, out)  # its redeliveries were settled with its run
    assert _never_overlaps(starts, dones)
    assert not ParkedMessage.objects.exists()


def test_a_run_taken_back_past_the_delivery_limit_is_parked_and_named(quorum_with_timeout):
    rmq = quorum_with_timeout
    proc = start_consumer(
        rmq.prefix,
        rmq.log,
        "gamma",
        "--threads",
        "2",
        RMQ_QUEUE_TYPE="quorum",
        RMQ_DELIVERY_LIMIT="2",
    )
    try:
        other.send({"id": "hung", "sleep": TIMEOUT_MS * 5 / 1000})
        assert wait_for(lambda: _events(rmq, "start", "hung"), 60), proc.output()
        other.send({"id": "neighbour"})
        assert wait_for(lambda: ParkedMessage.objects.exists(), 90), proc.output()
        row = ParkedMessage.objects.get()
        assert row.reason == "delivery_limit"
        assert "consumer timeout" in row.reason_detail, row.reason_detail
        assert wait_for(lambda: _events(rmq, "done", "hung"), 90), proc.output()
        assert _events(rmq, "done", "neighbour")
        assert wait_for(lambda: rmq.depth(rmq.queue("gamma")) == 0, 60)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert len(_events(rmq, "start", "hung")) == 1, out  # parked, never run again
    assert "its outcome is dropped" in out, out
    assert ParkedMessage.objects.count() == 1
