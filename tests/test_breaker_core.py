"""Pure tests of a dependency breaker's transitions (``core.breaker``): no broker, no
database, on a clock the test drives."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_rmq_retry.core.breaker import (
    Breaker,
    Gate,
    Limits,
    State,
    claim_probe,
    forced,
    gate,
    probe_dropped,
    probe_due,
    probe_failed,
    probe_passed,
    tripped,
)

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
LIMITS = Limits(
    ("builtins.ConnectionError",),
    trip_failures=5,
    trip_window=30,
    probe_after=10,
    probe_backoff_max=35,
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def opened() -> Breaker:
    b = tripped(Breaker(), 5, at(0), LIMITS, "5 failures")
    assert b is not None
    return b


def test_trips_at_trip_failures_and_not_before():
    assert tripped(Breaker(), 4, at(0), LIMITS, "x") is None
    b = opened()
    assert (b.state, b.since, b.trips, b.version) == (State.OPEN, at(0), 1, 1)
    assert b.next_probe_at == at(10) and b.probe_wait == 10
    assert tripped(b, 50, at(1), LIMITS, "again") is None  # open already: no second trip


def test_open_waits_probe_after_then_one_process_claims_the_probe():
    b = opened()
    assert not probe_due(b, at(9.9)) and claim_probe(b, at(9.9), "a") is None
    assert gate(b, at(5), "a") is Gate.WAIT
    probing = claim_probe(b, at(10), "a", lease=60)
    assert probing is not None and probing.state is State.HALF_OPEN
    assert gate(probing, at(11), "a") is Gate.PROBE
    assert gate(probing, at(11), "b") is Gate.WAIT  # one probe for the whole cluster
    assert claim_probe(probing, at(11), "b") is None


def test_failed_probes_double_the_wait_up_to_the_cap():
    b = opened()
    waits = []
    now = 0.0
    for _ in range(4):
        now += b.probe_wait
        probing = claim_probe(b, at(now), "a")
        assert probing is not None
        failed = probe_failed(probing, at(now + 1), "a", LIMITS, "still down")
        assert failed is not None and failed.state is State.OPEN
        waits.append(failed.probe_wait)
        assert failed.next_probe_at == at(now + 1 + failed.probe_wait)
        assert failed.trips == 1 and failed.since == at(now + 1)  # the same outage, one trip
        b = failed
        now += 1
    assert waits == [20, 35, 35, 35]


def test_a_passed_probe_closes():
    probing = claim_probe(opened(), at(10), "a")
    assert probing is not None
    assert probe_passed(probing, at(11), "b") is None  # only the owner's word counts
    closed = probe_passed(probing, at(11), "a")
    assert closed is not None
    assert (closed.state, closed.since, closed.probe_owner, closed.next_probe_at) == (
        State.CLOSED,
        at(11),
        "",
        None,
    )
    assert gate(closed, at(11), "b") is Gate.RUN


def test_a_lapsed_probe_is_claimed_again_and_its_late_word_is_ignored():
    probing = claim_probe(opened(), at(10), "a", lease=60)
    assert probing is not None
    assert gate(probing, at(70), "a") is Gate.WAIT  # its lease is over: no longer a probe
    taken = claim_probe(probing, at(70), "b", lease=60)
    assert taken is not None and taken.probe_owner == "b"
    assert probe_passed(taken, at(71), "a") is None
    assert probe_failed(taken, at(71), "a", LIMITS, "x") is None


def test_a_dropped_probe_keeps_the_wait_and_frees_the_claim():
    probing = claim_probe(opened(), at(10), "a")
    assert probing is not None
    dropped = probe_dropped(probing, at(12), "a")
    assert dropped is not None and dropped.state is State.OPEN
    assert dropped.probe_wait == 10 and dropped.next_probe_at == at(22)
    assert claim_probe(dropped, at(22), "b") is not None


def test_an_operator_opens_and_closes_from_any_state():
    b = forced(Breaker(), State.OPEN, at(0), LIMITS, "alice")
    assert b is not None and b.state is State.OPEN and b.trips == 1 and "alice" in b.reason
    assert forced(b, State.OPEN, at(1), LIMITS, "alice") is None
    probing = claim_probe(b, at(10), "a")
    assert probing is not None
    closed = forced(probing, State.CLOSED, at(11), LIMITS, "bob")
    assert closed is not None and closed.state is State.CLOSED
    assert forced(closed, State.CLOSED, at(12), LIMITS, "bob") is None
    with pytest.raises(ValueError):
        forced(closed, State.HALF_OPEN, at(12), LIMITS, "bob")


def test_every_step_bumps_the_version_a_conditional_update_expects():
    b = Breaker()
    seen = [b.version]
    b1 = opened()
    seen.append(b1.version)
    b2 = claim_probe(b1, at(10), "a")
    assert b2 is not None
    seen.append(b2.version)
    b3 = probe_passed(b2, at(11), "a")
    assert b3 is not None
    seen.append(b3.version)
    assert seen == [0, 1, 2, 3]


@given(
    st.lists(
        st.tuples(st.sampled_from(["trip", "claim", "pass", "fail", "drop"]), st.floats(0, 50)),
        max_size=40,
    )
)
def test_no_sequence_of_steps_runs_two_probes_or_waits_past_the_cap(steps):
    b = Breaker()
    now = 0.0
    for what, dt in steps:
        now += dt
        owner, t = ("a" if int(now) % 2 else "b"), at(now)
        after = {
            "trip": lambda b, t, o: tripped(b, 5, t, LIMITS, "x"),
            "claim": lambda b, t, o: claim_probe(b, t, o),
            "pass": lambda b, t, o: probe_passed(b, t, o),
            "fail": lambda b, t, o: probe_failed(b, t, o, LIMITS, "x"),
            "drop": lambda b, t, o: probe_dropped(b, t, o),
        }[what](b, t, owner)
        if after is None:
            continue
        assert after.version == b.version + 1
        b = after
        probes = [p for p in ("a", "b", "c") if gate(b, at(now), p) is Gate.PROBE]
        assert len(probes) <= 1
        assert b.probe_wait <= LIMITS.probe_backoff_max
        if b.state is State.OPEN:
            assert b.next_probe_at is not None and b.probe_wait >= LIMITS.probe_after


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({}, "EXCEPTIONS is empty"),
        ({"EXCEPTIONS": "builtins.ConnectionError"}, "dotted paths"),
        ({"EXCEPTIONS": ["builtins.OSError"], "TRIP_FAILURES": 0}, "TRIP_FAILURES"),
        ({"EXCEPTIONS": ["builtins.OSError"], "TRIP_WINDOW": -1}, "TRIP_WINDOW"),
        ({"EXCEPTIONS": ["builtins.OSError"], "PROBE_BACKOFF_MAX": 5}, "at least PROBE_AFTER"),
        ({"EXCEPTIONS": ["builtins.OSError"], "PROBE": 5}, "unknown key(s) PROBE"),
        ({"EXCEPTIONS": ["builtins.OSError"], "REPLAY_PARKED": 1}, "REPLAY_PARKED"),
    ],
)
def test_limits_name_what_is_wrong(data, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        Limits.from_mapping(data)


def test_listed_exceptions_match_subclasses_by_dotted_path():
    limits = Limits.from_mapping({"EXCEPTIONS": ["builtins.ConnectionError"]})
    assert limits.listed(ConnectionRefusedError("x"))
    assert not limits.listed(ValueError("x"))
    assert (limits.trip_failures, limits.probe_after, limits.replay_parked) == (5, 10.0, True)
