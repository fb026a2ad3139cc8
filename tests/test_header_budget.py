"""``core.header_budget``: a copy's optional headers shrink to fit its frame (pure)."""

from __future__ import annotations

import json

from django_rmq_retry.core.header_budget import (
    CUT_MARK,
    fit_headers,
    properties_room,
    too_large_detail,
)


def size(props) -> int:
    return len(json.dumps(props, sort_keys=True).encode())


DROPPABLE = ("error", "error-type", "first-failure")


def props(error: str = "e" * 300) -> dict:
    return {
        "message_id": "m",
        "headers": {
            "mine": "x" * 100,
            "attempt": 2,
            "error": error,
            "error-type": "ValueError",
            "first-failure": "2026-01-01T00:00:00.000+00:00",
        },
    }


def fit(p, room):
    return fit_headers(p, room, size, error_header="error", droppable=DROPPABLE)


def test_room_of_a_frame():
    assert properties_room(4096) == 4096 - 8 - 12
    assert properties_room(0) is None


def test_what_fits_is_left_alone():
    p = props()
    assert fit(p, size(p)) == p
    assert fit(p, None) == p


def test_the_error_text_is_shortened_first_and_marked():
    p = props()
    out = fit(p, size(p) - 100)
    assert out is not None and size(out) <= size(p) - 100
    error = out["headers"]["error"]
    assert error.endswith(CUT_MARK) and error.startswith("eee") and len(error) < 300
    assert {k: v for k, v in out["headers"].items() if k != "error"} == {
        k: v for k, v in p["headers"].items() if k != "error"
    }
    assert p["headers"]["error"] == "e" * 300  # the input is not changed


def test_a_shortened_character_is_never_cut_in_half():
    p = props("é" * 200)
    out = fit(p, size(p) - 101)
    assert out is not None
    assert set(out["headers"]["error"].removesuffix(CUT_MARK)) == {"é"}


def test_then_the_failure_story_goes_in_order():
    p = props()
    no_error = {**p, "headers": {k: v for k, v in p["headers"].items() if k != "error"}}
    out = fit(p, size(no_error))
    assert out == no_error
    bare = {"message_id": "m", "headers": {"mine": "x" * 100, "attempt": 2}}
    assert fit(p, size(bare)) == bare


def test_what_we_need_and_the_callers_headers_are_never_dropped():
    p = props()
    bare = {"message_id": "m", "headers": {"mine": "x" * 100, "attempt": 2}}
    assert fit(p, size(bare) - 1) is None


def test_the_reason_names_the_limit():
    text = too_large_detail(4096, 4200)
    assert "frame_max 4096" in text and "4076" in text and "4200" in text
