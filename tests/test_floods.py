"""A flood of parks in a few log lines: core.floods (pure) and a consumer's output."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from django_rmq_retry.core.floods import BURST, FloodSummary, Summary


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_of_each_interval_are_told_the_rest_counted():
    clock = Clock()
    flood = FloodSummary(10, clock=clock)
    told = [flood.admit("x") for _ in range(5000)]
    assert told.count(True) == BURST and told[:BURST] == [True] * BURST
    assert flood.admit("y")  # another receiver has its own burst
    clock.now += 9.9
    assert flood.due() == []  # the interval has not passed
    clock.now += 0.1
    assert flood.due() == [Summary("x", 4990, pytest.approx(10.0))]
    # Still flooding: the next interval tells no line one by one, it counts.
    assert not flood.admit("x")
    clock.now += 3
    assert flood.due(everything=True) == [Summary("x", 1, pytest.approx(3.0))]
    assert flood.admit("x")  # over: the next park is told again


def test_interval_zero_tells_every_event():
    flood = FloodSummary(0)
    assert all(flood.admit("x") for _ in range(100))
    assert flood.due(everything=True) == []


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_consumer_summarises_a_flood_of_parks_in_its_output(rmq):
    from tests.conftest import start_consumer
    from tests.testapp.events import other

    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send_many([{"id": i, "reject": True} for i in range(60)])
    proc = start_consumer(rmq.prefix, rmq.log, "gamma", "--max-idle-time", "3")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    one_by_one = [
        line for line in out.splitlines() if "parked tests.testapp.consumers.gamma" in line
    ]
    assert len(one_by_one) == BURST, out
    assert "parked 50 more message(s) of tests.testapp.consumers.gamma in the last" in out, out
