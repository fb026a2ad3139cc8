"""The periodic schedules' pure rules (``core.schedule``): no database, no clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from django_rmq_retry.core.schedule import Cron, ScheduleError, first_due, next_due

UTC = timezone.utc


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("*/15 * * * *", "2026-11-28 12:07:30", "2026-11-28 12:15:00"),
        ("0 3 * * *", "2026-11-28 03:00:00", "2026-11-29 03:00:00"),
        ("30 9 * * 1-5", "2026-11-28 10:00:00", "2026-11-30 09:30:00"),  # Sat -> Mon
        ("0 0 1 * *", "2026-12-15 00:00:00", "2027-01-01 00:00:00"),
        ("0 12 29 2 *", "2026-03-01 00:00:00", "2028-02-29 12:00:00"),
        ("0 0 13 * 5", "2026-11-28 00:00:00", "2026-12-04 00:00:00"),  # the 13th OR a Friday
        ("5-10/5 * * * *", "2026-11-28 12:06:00", "2026-11-28 12:10:00"),
        ("0 0 * * 7", "2026-11-28 00:00:00", "2026-11-29 00:00:00"),  # 7 is Sunday
    ],
)
def test_cron_next_after(expr, after, expected):
    assert Cron.parse(expr).next_after(at(after)) == at(expected)


@pytest.mark.parametrize(
    "expr", ["* * * *", "61 * * * *", "*/0 * * * *", "a * * * *", "0 0 31 2 *", "5-1 * * * *"]
)
def test_cron_refuses_what_cannot_run(expr):
    with pytest.raises(ScheduleError):
        Cron.parse(expr).next_after(at("2026-11-28 00:00:00"))


def test_an_interval_on_time_ticks_once_per_period():
    due = at("2026-11-28 12:00:00")
    assert next_due(due, due + timedelta(seconds=0.2), every=60) == due + timedelta(seconds=60)


def test_missed_ticks_run_once_then_the_schedule_resumes_in_phase():
    """Ten minutes of downtime with a one-minute interval: the overdue tick is the one
    enqueued, the nine behind it are skipped, the next tick keeps the schedule's phase."""
    due = at("2026-11-28 12:00:00")
    now = due + timedelta(minutes=10, seconds=20)
    assert next_due(due, now, every=60) == at("2026-11-28 12:11:00")
    cron = Cron.parse("*/5 * * * *")
    assert next_due(due, now, cron=cron) == at("2026-11-28 12:15:00")


def test_first_due():
    now = at("2026-11-28 12:00:30")
    assert first_due(now, every=10) == now + timedelta(seconds=10)
    assert first_due(now, cron=Cron.parse("* * * * *")) == at("2026-11-28 12:01:00")
