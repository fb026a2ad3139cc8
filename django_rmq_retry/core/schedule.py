"""Periodic schedules: an interval or a five-field cron expression, and the next tick.

Pure (standard library only), so the rules are tested without a database or a clock:

* ``Cron``: ``minute hour day-of-month month day-of-week`` with ``*``, ``a``, ``a-b``,
  ``a,b``, ``*/n`` and ``a-b/n``; day of week 0-6 from Sunday (7 is Sunday too). As in cron,
  when both day fields are restricted a day matching either one matches. Read in UTC.
* ``next_due``: the tick after one that was just enqueued. **Missed ticks** (the consumers
  were down): the overdue tick runs once, the ones missed behind it are skipped, and the
  next tick is the schedule's first time after now, so a day of downtime never floods the
  queue with a day of ticks. An interval keeps its phase (``due + k * every``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day", 1, 31), ("month", 1, 12), ("weekday", 0, 7))


class ScheduleError(ValueError):
    """An interval or a cron expression that cannot be used (the message says why)."""


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ScheduleError(f"cron {name}: bad step {step_text!r}")
            step = int(step_text)
        if body == "*":
            start, end = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            if not (a.isdigit() and b.isdigit()):
                raise ScheduleError(f"cron {name}: bad range {body!r}")
            start, end = int(a), int(b)
        elif body.isdigit():
            start = end = int(body)
            if step_text:
                end = high
        else:
            raise ScheduleError(f"cron {name}: bad value {body!r}")
        if not low <= start <= end <= high:
            raise ScheduleError(f"cron {name}: {part!r} is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str) -> Cron:
        parts = expression.split()
        if len(parts) != 5:
            raise ScheduleError(
                f"cron {expression!r}: five fields (minute hour day month weekday), "
                f"got {len(parts)}"
            )
        sets = [_field(p, n, lo, hi) for p, (n, lo, hi) in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(sets[0], sets[1], sets[2], sets[3], weekdays, parts[2] == "*", parts[4] == "*")

    def _day_matches(self, at: datetime) -> bool:
        in_month = at.day in self.days
        in_week = (at.weekday() + 1) % 7 in self.weekdays  # Python: Monday 0; cron: Sunday 0
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def next_after(self, after: datetime) -> datetime:
        """The first minute strictly after ``after`` that matches (UTC)."""
        at = after.astimezone(timezone.utc).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = at + timedelta(days=366 * 5)
        while at < limit:
            if at.month not in self.months:
                at = (at.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(at):
                at = at.replace(hour=0, minute=0) + timedelta(days=1)
            elif at.hour not in self.hours:
                at = at.replace(minute=0) + timedelta(hours=1)
            elif at.minute not in self.minutes:
                at += timedelta(minutes=1)
            else:
                return at
        raise ScheduleError("cron: no matching time within five years (e.g. 31 February)")


def next_due(
    due: datetime, now: datetime, *, every: float | None = None, cron: Cron | None = None
) -> datetime:
    """The tick after ``due`` (just enqueued), never at or before ``now``: see the module
    docstring for the missed-ticks rule."""
    if every is not None:
        if every <= 0:
            raise ScheduleError("an interval is a positive number of seconds")
        step = timedelta(seconds=every)
        missed = max(0, int((now - due) / step))
        nxt = due + step * (missed + 1)
        while nxt <= now:
            nxt += step
        return nxt
    if cron is None:
        raise ScheduleError("a schedule is an interval or a cron expression")
    return cron.next_after(max(due, now))


def first_due(now: datetime, *, every: float | None = None, cron: Cron | None = None) -> datetime:
    """A new schedule's first tick: one interval from now, or cron's next minute."""
    if every is not None:
        return now + timedelta(seconds=every)
    if cron is None:
        raise ScheduleError("a schedule is an interval or a cron expression")
    return cron.next_after(now)
