"""The pure rules of per-key order (``core.ordering``): no broker, no database."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from django_rmq_retry.core.ordering import (
    KEY_MAX,
    Arrival,
    Hold,
    HoldState,
    Incoming,
    OrderingKeyError,
    Step,
    after_attempt,
    after_park,
    held_reason,
    key_from_body,
    on_arrival,
    partition_of,
)


def test_partition_is_the_same_in_another_process_with_another_hash_seed() -> None:
    keys = [f"account-{i}" for i in range(50)] + ["é", "日本", "42"]
    here = [partition_of(k, 8) for k in keys]
    code = (
        "import sys, json; from django_rmq_retry.core.ordering import partition_of; "
        "print(json.dumps([partition_of(k, 8) for k in json.loads(sys.argv[1])]))"
    )
    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(keys)],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        assert json.loads(out) == here


def test_partition_values_are_pinned() -> None:
    # Queued messages outlive deployments: the mapping may never change between versions.
    assert [partition_of(k, 4) for k in ("a", "b", "account-1", "42")] == [3, 1, 0, 0]
    assert partition_of("a", 4) == 0xE8B7BE43 % 4  # zlib.crc32(b"a")
    assert partition_of("account-1", 1) == 0


def test_keys_spread_over_every_partition() -> None:
    counts = Counter(partition_of(f"k{i}", 4) for i in range(400))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > 50


def test_partition_count_must_be_positive() -> None:
    with pytest.raises(ValueError):
        partition_of("a", 0)


def test_key_from_body_reads_a_field_or_a_nested_field() -> None:
    assert key_from_body({"account_id": "A1"}, "account_id") == "A1"
    assert key_from_body({"account_id": 42}, "account_id") == "42"
    assert key_from_body({"a": {"b": "x"}}, "a.b") == "x"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "no field 'account_id'"),
        ("text", "no field 'account_id'"),
        ({"account_id": None}, "None"),
        ({"account_id": True}, "True"),
        ({"account_id": ""}, "empty"),
        ({"account_id": ["x"]}, "text or a number"),
        ({"account_id": "x" * (KEY_MAX + 1)}, "longer than"),
    ],
)
def test_a_bad_key_is_refused_with_a_readable_reason(body: object, says: str) -> None:
    with pytest.raises(OrderingKeyError, match=says):
        key_from_body(body, "account_id")


def test_a_free_key_runs_and_a_held_key_sets_other_messages_aside() -> None:
    assert on_arrival(None, Incoming("m1")) is Arrival.RUN
    hold = Hold("m1", HoldState.RETRYING)
    assert on_arrival(hold, Incoming("m1")) is Arrival.RUN  # its retry copy
    assert on_arrival(hold, Incoming("m2")) is Arrival.SET_ASIDE
    assert on_arrival(Hold("m1", HoldState.PARKED), Incoming("m2")) is Arrival.SET_ASIDE


def test_released_copies_run_one_by_one_in_row_order() -> None:
    hold = Hold("m1", HoldState.RELEASING, first_row=10)
    assert on_arrival(hold, Incoming("m2", row=10, row_held=True)) is Arrival.RUN
    # a later row's copy ahead of its turn keeps its row (its place), and is acked
    assert on_arrival(hold, Incoming("m3", row=11, row_held=True)) is Arrival.KEEP
    # a new message of the key goes behind every row
    assert on_arrival(hold, Incoming("m9")) is Arrival.SET_ASIDE
    # the old blocker again (a redelivery after it ran): it ran, never again
    assert on_arrival(hold, Incoming("m1")) is Arrival.DUPLICATE


def test_a_copy_whose_row_is_gone_ran_before() -> None:
    assert on_arrival(None, Incoming("m2", row=10, row_held=False)) is Arrival.DUPLICATE
    hold = Hold("m5", HoldState.RETRYING)
    assert on_arrival(hold, Incoming("m2", row=10, row_held=False)) is Arrival.DUPLICATE
    # the blocker's retry copy still carries the row header of the copy it was
    assert on_arrival(Hold("m2", HoldState.RETRYING), Incoming("m2", row=10)) is Arrival.RUN
    # a released copy meeting a new blocker waits again, keeping its row
    assert on_arrival(hold, Incoming("m2", row=10, row_held=True)) is Arrival.KEEP


def test_a_failure_holds_its_key_until_the_blocker_succeeds() -> None:
    assert after_attempt(None, Incoming("m1"), failed=True) is Step.HOLD
    hold = Hold("m1", HoldState.RETRYING)
    assert after_attempt(hold, Incoming("m1"), failed=True) is Step.NOTHING
    assert after_attempt(hold, Incoming("m1"), failed=False) is Step.RELEASE
    assert after_attempt(None, Incoming("m1"), failed=False) is Step.NOTHING


def test_a_released_copy_either_finishes_its_row_or_becomes_the_blocker() -> None:
    hold = Hold("m1", HoldState.RELEASING, first_row=10)
    copy = Incoming("m2", row=10, row_held=True)
    assert after_attempt(hold, copy, failed=False) is Step.ROW_DONE
    assert after_attempt(hold, copy, failed=True) is Step.BLOCK


def test_park_holds_the_key_or_skips_it() -> None:
    hold = Hold("m1", HoldState.RETRYING)
    assert after_park(hold, "m1", "hold") is Step.HOLD_PARKED
    assert after_park(hold, "m1", "skip") is Step.RELEASE
    assert after_park(hold, "m2", "hold") is Step.NOTHING  # not the blocker
    assert after_park(None, "m1", "hold") is Step.NOTHING
    assert after_park(Hold("m1", HoldState.RELEASING), "m1", "hold") is Step.NOTHING
    with pytest.raises(ValueError):
        after_park(hold, "m1", "drop")


def test_the_held_reason_names_the_blocker_and_the_key() -> None:
    text = held_reason("abc", "A1", HoldState.PARKED)
    assert "abc" in text and "'A1'" in text and "parked" in text
