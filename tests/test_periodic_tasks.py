"""Periodic tasks: schedules in settings or rows, a tick enqueued once by any number of
consumer processes (a conditional UPDATE per tick), missed ticks run once."""

from __future__ import annotations

import itertools
import re
import signal
from datetime import datetime, timedelta

import pytest

from django_rmq_retry.registry.task_api import task_api_module

pytestmark = pytest.mark.skipif(
    task_api_module() is None,
    reason="Django < 6.0 without the django-tasks backport (pip install django-tasks)",
)

if task_api_module() is not None:
    from django.core.management import call_command
    from django.test import override_settings
    from django.utils import timezone

    from django_rmq_retry.models import PeriodicTask, TaskResultRecord
    from django_rmq_retry.tasks import periodic
    from django_rmq_retry.testing import InMemoryBroker
    from tests.conftest import start_consumer, wait_for

ADD = "tests.tasksproject.tasks.add"


def _tasks_setting(periodic_specs):
    return {
        "default": {
            "BACKEND": "django_rmq_retry.tasks.RabbitMQBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"periodic": periodic_specs},
        }
    }


@pytest.mark.django_db(transaction=True)
def test_settings_declare_rows_and_a_tick_is_taken_once():
    specs = {"sum": {"task": ADD, "every": 60, "args": [1, 2]}}
    with override_settings(TASKS=_tasks_setting(specs)), InMemoryBroker() as broker:
        start = timezone.now()
        periodic.sync_declared(start)
        periodic.sync_declared(start)  # idempotent: a second consumer's start
        row = PeriodicTask.objects.get(name="sum")
        assert row.source == "settings" and row.next_run_at == start + timedelta(seconds=60)
        tick = row.next_run_at + timedelta(seconds=0.5)
        # Two processes see the same due tick: one enqueues it.
        assert periodic.tick_due(tick) + periodic.tick_due(tick) == 1
        broker.run_until_idle()
    row.refresh_from_db()
    assert row.runs == 1 and row.next_run_at == start + timedelta(seconds=120)
    result = TaskResultRecord.objects.get(id=row.last_result_id)
    assert result.status == "SUCCESSFUL" and result.return_value == 3


@pytest.mark.django_db(transaction=True)
def test_missed_ticks_after_downtime_run_once():
    due = timezone.now() - timedelta(minutes=10, seconds=20)
    PeriodicTask.objects.create(
        name="m", task_path=ADD, args=[0, 0], every_seconds=60, next_run_at=due
    )
    with InMemoryBroker():
        assert periodic.tick_due() == 1
        assert periodic.tick_due() == 0  # the nine missed behind it are not enqueued
    row = PeriodicTask.objects.get(name="m")
    assert row.runs == 1 and row.next_run_at == due + timedelta(minutes=11)
    assert TaskResultRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_schedule_that_cannot_run_is_disabled():
    PeriodicTask.objects.create(
        name="gone",
        task_path="tests.tasksproject.tasks.nothing_here",
        every_seconds=1,
        next_run_at=timezone.now(),
    )
    assert periodic.tick_due() == 0
    assert not PeriodicTask.objects.get(name="gone").enabled


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_real_broker_three_consumers_tick_once_per_period(rmq, tmp_path):
    """A one-second schedule and three rmq_consume processes stepping it: each tick is
    enqueued once (its due time in one log line of one process), the ticks keep the
    schedule's phase (whole periods apart: more than one only where a step came a period
    late on a loaded host, the missed-ticks rule), and each ran once."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    PeriodicTask.objects.create(
        name="tick",
        task_path=ADD,
        args=[7, 7],
        every_seconds=1,
        next_run_at=timezone.now() + timedelta(seconds=1),
    )
    children = [start_consumer(rmq.prefix, rmq.log) for _ in range(3)]
    try:
        assert wait_for(
            lambda: TaskResultRecord.objects.filter(status="SUCCESSFUL").count() >= 3, 120
        )
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        outputs = [child.communicate(timeout=120)[0] for child in children]
    ticks = [t for out in outputs for t in re.findall(r"periodic tick: tick (\S+) enqueued", out)]
    row = PeriodicTask.objects.get(name="tick")
    assert len(ticks) == len(set(ticks)) == row.runs  # each tick enqueued by one process
    stamps = sorted(datetime.fromisoformat(t) for t in ticks)
    gaps = [(b - a) / timedelta(seconds=1) for a, b in itertools.pairwise(stamps)]
    assert all(g >= 1 and g == int(g) for g in gaps), gaps
    results = TaskResultRecord.objects.filter(task_path=ADD)
    assert results.count() == row.runs
    assert {r.return_value for r in results if r.status == "SUCCESSFUL"} == {14}


@pytest.mark.django_db
def test_admin_declares_a_schedule_that_starts_from_now(admin_client):
    from django.urls import reverse

    page = reverse("admin:django_rmq_retry_periodictask_add")
    bad = admin_client.post(
        page,
        {
            "name": "x",
            "task_path": ADD,
            "backend": "default",
            "args": "[]",
            "kwargs": "{}",
            "cron": "61 * * * *",
        },
    )
    assert bad.status_code == 200 and not PeriodicTask.objects.exists()  # the form says why
    before = timezone.now()
    admin_client.post(
        page,
        {
            "name": "every-5",
            "task_path": ADD,
            "backend": "default",
            "args": "[1, 1]",
            "kwargs": "{}",
            "every_seconds": "5",
            "enabled": "on",
        },
    )
    row = PeriodicTask.objects.get(name="every-5")
    assert (
        row.source == "admin" and row.enabled and row.next_run_at >= before + timedelta(seconds=5)
    )
    listing = admin_client.get(reverse("admin:django_rmq_retry_periodictask_changelist"))
    assert "every 5 s" in listing.content.decode()
