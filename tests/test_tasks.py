"""``django.tasks`` on RabbitMQ: ``RabbitMQBackend`` in the in-memory broker and the real one.

Django 6's ``django.tasks``, or Django 5.2 with the django-tasks backport; ``tests.settings``
declares ``TASKS`` when either is there.
"""

from __future__ import annotations

import json
from datetime import timedelta

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

    from django_rmq_retry.models import ParkedMessage, TaskResultRecord
    from django_rmq_retry.parking import requeue
    from django_rmq_retry.tasks.api import (
        TaskResultStatus,
        task_backends,
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_rmq_retry.tasks.task_message import amqp_priority
    from django_rmq_retry.testing import InMemoryBroker
    from tests.conftest import wait_for
    from tests.tasksproject import tasks as t


@pytest.fixture(autouse=True)
def _runs():
    t.RUNS.clear()
    yield
    t.RUNS.clear()


def test_priority_maps_onto_eleven_rabbitmq_priorities():
    assert [amqp_priority(p) for p in (-100, -91, -90, -10, 0, 9, 10, 90, 100)] == [
        0,
        0,
        1,
        5,
        5,
        5,
        6,
        10,
        10,
    ]


# In memory ---------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_in_memory_a_task_runs_and_its_result_is_read_back():
    seen = []

    def record(signal):
        def receive(sender, task_result, **kwargs):
            seen.append((signal, task_result.id, task_result.status))

        return receive

    handlers = {
        s: record(name)
        for s, name in (
            (task_enqueued, "enqueued"),
            (task_started, "started"),
            (task_finished, "finished"),
        )
    }
    for s, h in handlers.items():
        s.connect(h)
    try:
        with InMemoryBroker() as broker:
            result = t.add.enqueue(2, 3)
            assert result.status == TaskResultStatus.READY
            broker.run_until_idle()
    finally:
        for s, h in handlers.items():
            s.disconnect(h)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert len(result.worker_ids) == 1
    assert result.errors == []
    assert t.RUNS == [("add", 1, [2, 3])]
    assert [(s, st) for s, _i, st in seen] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    assert {i for _s, i, _st in seen} == {result.id}


@pytest.mark.django_db(transaction=True)
def test_in_memory_retries_count_attempts_and_keep_one_error_each():
    finished = []

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result.status)

    task_finished.connect(on_finished)
    try:
        with InMemoryBroker() as broker:
            result = t.flaky_task.enqueue(succeed_on=3)
            broker.run_until_idle()
    finally:
        task_finished.disconnect(on_finished)
    assert [a for _n, a, _x in t.RUNS] == [1, 2, 3]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 3, "result_id": result.id}
    assert result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "attempt 2 fails" in result.errors[1].traceback
    assert finished == [TaskResultStatus.SUCCESSFUL]  # once, when the outcome is final


@pytest.mark.django_db(transaction=True)
def test_in_memory_exhausted_task_is_parked_with_its_arguments():
    with InMemoryBroker() as broker:
        result = t.always_fails.enqueue("transient")
        broker.run_until_idle()
    assert [a for _n, a, _x in t.RUNS] == [1, 2]  # the task's own max_attempts=2
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2
    row = ParkedMessage.objects.get()
    assert row.message_id == result.id
    assert row.reason == "exhausted"
    assert b'"args": ["transient"]' in bytes(row.body) or b'"args":["transient"]' in bytes(row.body)
    assert row.receiver == "tasks.default.tests.tasksproject.tasks.always_fails"


@pytest.mark.django_db(transaction=True)
def test_in_memory_non_retryable_error_parks_at_once():
    with InMemoryBroker() as broker:
        result = t.always_fails.enqueue("permanent")
        broker.run_until_idle()
    assert [a for _n, a, _x in t.RUNS] == [1]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert ParkedMessage.objects.get().reason == "non_retryable"


@pytest.mark.django_db(transaction=True)
def test_in_memory_deferred_task_waits_in_the_delay_levels():
    with InMemoryBroker() as broker:
        result = t.add.using(run_after=timezone.now() + timedelta(hours=2)).enqueue(1, 1)
        broker.run_until_idle()
    assert t.RUNS == [("add", 1, [1, 1])]
    (run,) = [r for r in broker.runs if r.message_id == result.id]
    assert run.at >= 2 * 3600 - 1  # virtual seconds: the levels held it two hours


@pytest.mark.django_db(transaction=True)
def test_in_memory_a_task_deferred_for_months_runs_once_at_its_time():
    """Sixty days: six rounds of the levels' longest hold (9.7 days) and the rest, reckoned
    from the due times the message carries (the virtual clock is not this process's)."""
    run_after = timezone.now() + timedelta(days=60)
    with InMemoryBroker() as broker:
        result = t.add.using(run_after=run_after).enqueue(2, 2)
        broker.run_until_idle()
    assert t.RUNS == [("add", 1, [2, 2])]
    arrivals = [r.at for r in broker.runs if r.message_id == result.id]
    # Seven arrivals: six rounds ended and sent round again, then the run, at its time
    # (virtual seconds; the in-memory levels land each round one landing, 0.1 s, early and
    # hold nothing: the real consumer holds the landing, test_real_broker_run_after_...).
    assert len(arrivals) == 7
    assert 60 * 24 * 3600 - 7 * 0.1 <= arrivals[-1] <= 60 * 24 * 3600
    assert all(
        b - a <= 9.71 * 24 * 3600 for a, b in zip([0, *arrivals[:-1]], arrivals, strict=True)
    )
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.django_db(transaction=True)
def test_in_memory_a_tasks_backoff_chooses_each_wait_and_none_parks():
    with InMemoryBroker() as broker:
        waited = t.calls_a_rate_limited_api.enqueue([30.0, 90.0])
        stopped = t.calls_a_rate_limited_api.enqueue([None])
        broker.run_until_idle()
    at = [r.at for r in broker.runs if r.message_id == waited.id]
    assert len(at) == 3 and 30 <= at[1] - at[0] < 31 and 90 <= at[2] - at[1] < 91
    waited.refresh()
    assert waited.status == TaskResultStatus.SUCCESSFUL and waited.return_value == 3
    assert [e.exception_class_path for e in waited.errors] == [
        "tests.tasksproject.tasks.RateLimited"
    ] * 2
    stopped.refresh()
    assert stopped.status == TaskResultStatus.FAILED and stopped.attempts == 1
    assert ParkedMessage.objects.get(message_id=stopped.id).reason == "rejected"


@pytest.mark.django_db(transaction=True)
def test_in_memory_cancel_a_deferred_task_and_a_parked_one():
    from django_rmq_retry.tasks import cancel

    with InMemoryBroker() as broker:
        deferred = t.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
        doomed = t.always_fails.enqueue("transient")
        done = t.add.enqueue(3, 3)
        assert cancel(deferred)
        broker.run_until_idle()
        assert sorted(n for n, _a, _x in t.RUNS) == ["add", "always_fails", "always_fails"]
        assert not cancel(done) and not cancel(deferred)  # finished, already cancelled
        assert cancel(doomed)  # parked: cancelled, and a requeue of it does not run it
        requeue(ParkedMessage.objects.filter(message_id=doomed.id))
        broker.run_until_idle()
    assert [n for n, _a, _x in t.RUNS].count("always_fails") == 2
    for result in (deferred, doomed):
        result.refresh()
        assert result.status == TaskResultStatus.FAILED and result.is_finished
        assert result.errors[-1].exception_class_path.endswith(".TaskCancelled")
        assert TaskResultRecord.objects.get(id=result.id).status == "CANCELLED"
    assert deferred.attempts == 0


@pytest.mark.django_db(transaction=True)
def test_in_memory_async_task_runs():
    with InMemoryBroker() as broker:
        result = t.async_add.enqueue(20, 22)
        broker.run_until_idle()
    result.refresh()
    assert result.return_value == 42


@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result():
    from asgiref.sync import async_to_sync

    with InMemoryBroker() as broker:
        result = async_to_sync(t.add.aenqueue)(4, 5)
        broker.run_until_idle()
    again = async_to_sync(t.add.aget_result)(result.id)
    assert again.status == TaskResultStatus.SUCCESSFUL and again.return_value == 9


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("error", ["UnroutableError", "BrokerUnavailable"])
def test_a_task_not_enqueued_leaves_no_result_row(monkeypatch, error):
    from django_rmq_retry.core import errors

    exc = getattr(errors, error)
    with InMemoryBroker() as broker:

        def refuse(*args, **kwargs):
            raise exc("refused, or no broker")

        monkeypatch.setattr(broker.publisher, "_send_batch", refuse)
        with pytest.raises(exc):
            t.add.enqueue(1, 2)
    assert not TaskResultRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_results_off_writes_no_row_and_get_result_says_so():
    options = {"results": False}
    tasks_setting = {
        "default": {
            "BACKEND": "django_rmq_retry.tasks.RabbitMQBackend",
            "QUEUES": ["default"],
            "OPTIONS": options,
        }
    }
    with override_settings(TASKS=tasks_setting), InMemoryBroker() as broker:
        result = t.flaky_task.enqueue(succeed_on=2)
        broker.run_until_idle()
        assert [a for _n, a, _x in t.RUNS] == [1, 2]  # attempt right without a row
        assert not TaskResultRecord.objects.exists()
        assert not task_backends["default"].supports_get_result
        with pytest.raises(NotImplementedError):
            result.refresh()


@pytest.mark.django_db(transaction=True)
def test_outbox_sends_a_task_only_if_the_transaction_commits():
    from django.db import transaction

    tasks_setting = {
        "default": {
            "BACKEND": "django_rmq_retry.tasks.RabbitMQBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"outbox": True},
        }
    }
    with override_settings(TASKS=tasks_setting), InMemoryBroker() as broker:
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = t.add.enqueue(1, 2)
            raise RuntimeError("roll back")
        with transaction.atomic():
            kept = t.add.enqueue(3, 4)
        broker.run_until_idle()
        assert t.RUNS == [("add", 1, [3, 4])]
        assert TaskResultRecord.objects.get(id=kept.id).status == "SUCCESSFUL"
        assert not TaskResultRecord.objects.filter(id=rolled_back.id).exists()


@pytest.mark.django_db(transaction=True)
def test_admin_shows_each_attempt_and_requeues_the_parked_task(admin_client):
    from django.contrib.admin import helpers
    from django.urls import reverse

    from django_rmq_retry.parking import operations

    with InMemoryBroker() as broker:
        result = t.always_fails.enqueue("transient")
        broker.run_until_idle()
        row = ParkedMessage.objects.get(message_id=result.id)
        page = admin_client.get(
            reverse("admin:django_rmq_retry_taskresultrecord_change", args=[result.id])
        ).content.decode()
        assert page.count("builtins.ValueError") == 2  # one per failed attempt
        assert "failed on attempt 2" in page and "&quot;transient&quot;" in page
        assert reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk]) in page
        parked_page = admin_client.get(
            reverse("admin:django_rmq_retry_parkedmessage_change", args=[row.pk])
        ).content.decode()
        assert "transient" in parked_page  # the task's arguments, in its body
        admin_client.post(
            reverse("admin:django_rmq_retry_parkedmessage_changelist"),
            {"action": "requeue_selected", helpers.ACTION_CHECKBOX_NAME: [row.pk]},
        )
        # The admin started an operation; a step (a consumer's, here this process's) sends.
        assert operations.advance_due() == 1
        broker.run_until_idle()
    assert [a for n, a, _x in t.RUNS if n == "always_fails"] == [1, 2, 3, 4]
    result.refresh()
    assert len(result.errors) == 4 and result.status == TaskResultStatus.FAILED


# The real broker ---------------------------------------------------------------------------
def consume(*names: str, count: int, idle: float = 5) -> None:
    call_command("rmq_consume", *names, max_messages=count, max_idle_time=idle, verbosity=0)


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_runs_retries_parks_and_requeues_a_task(rmq, registry_snapshot):
    two_queues = {
        "default": {
            "BACKEND": "django_rmq_retry.tasks.RabbitMQBackend",
            "QUEUES": ["default", "urgent"],
        }
    }
    with override_settings(TASKS=two_queues):
        _real_broker_round()


def _real_broker_round():
    urgent = t.flaky_task.using(queue_name="urgent")  # declares the urgent queues
    call_command("rmq_consume", setup_only=True, verbosity=0)
    ok = t.add.enqueue(40, 2)
    flaky = urgent.enqueue(succeed_on=2)
    doomed = t.always_fails.enqueue("transient")
    later = t.add.using(run_after=timezone.now() + timedelta(seconds=1.5)).enqueue(1, 2)
    # ok, flaky x2, doomed x2, later
    consume(
        "tasks.default.tests.tasksproject.tasks.add",
        "tasks.urgent.tests.tasksproject.tasks.flaky_task",
        "tasks.default.tests.tasksproject.tasks.always_fails",
        count=6,
        idle=10,
    )
    for r in (ok, flaky, doomed, later):
        r.refresh()
    assert ok.return_value == 42
    assert flaky.return_value["attempt"] == 2 and len(flaky.errors) == 1
    assert doomed.status == TaskResultStatus.FAILED and len(doomed.errors) == 2
    assert later.return_value == 3
    assert later.started_at >= later.task.run_after
    row = ParkedMessage.objects.get(message_id=doomed.id)
    # An operator requeues it (the same service as the admin's action): it runs again.
    requeue(ParkedMessage.objects.filter(pk=row.pk))
    consume("tasks.default.tests.tasksproject.tasks.always_fails", count=2, idle=10)
    assert wait_for(lambda: (doomed.refresh(), len(doomed.errors) == 4)[1], 60)
    assert [n for n, _a, _x in t.RUNS].count("always_fails") == 4


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_awaits_async_tasks_on_the_event_loop(rmq):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    t.ASYNC_THREADS.clear()
    ok = t.async_add.enqueue(20, 22)
    retried = t.async_add.enqueue(-1, 5)
    consume("tasks.default.tests.tasksproject.tasks.async_add", count=3, idle=10)
    ok.refresh()
    retried.refresh()
    assert ok.return_value == 42
    assert retried.return_value == 4 and len(retried.errors) == 1 and retried.attempts == 2
    assert t.ASYNC_THREADS and all(n == "rmq-async-loop" for n in t.ASYNC_THREADS)


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_runs_a_high_priority_task_first(rmq):
    from django_rmq_retry.conf import app_settings

    if app_settings.QUEUE_TYPE == "quorum":
        pytest.skip("quorum queues take no x-max-priority (docs/tutorial/tasks.md)")
    call_command("rmq_consume", setup_only=True, verbosity=0)
    queue = f"{rmq.prefix}.tasks.default.tests.tasksproject.tasks.add"
    args = rmq.ch().queue_declare(queue, passive=True)
    assert args.method.message_count == 0
    for i in range(5):
        t.add.using(priority=-100).enqueue(i, 0)
    t.add.using(priority=100).enqueue(100, 0)
    call_command(
        "rmq_consume",
        "tasks.default.tests.tasksproject.tasks.add",
        max_messages=6,
        max_idle_time=10,
        prefetch=1,
        threads=1,
        verbosity=0,
    )
    assert [x[0] for _n, _a, x in t.RUNS] == [100, 0, 1, 2, 3, 4]


# The tutorial ----------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_the_tutorials_tasks_module_runs_as_written(tmp_path, monkeypatch, registry_snapshot):
    """docs/tutorial/tasks.md's ``TASKS`` and ``shop/tasks.py``, word for word, on this
    Django (6.x, or 5.2 with the backport): it imports, its options are taken, a task runs."""
    import re
    import sys
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "tutorial" / "tasks.md").read_text()
    (code,) = re.findall(r"```python\n(# shop/tasks\.py\n.*?)```", page, re.S)
    (settings_code,) = re.findall(r"```python\n# settings\.py\n(TASKS = .*?)```", page, re.S)
    (periodic_code,) = re.findall(
        r"```python\n# settings\.py\n(TASKS\[\"default\"\]\[\"OPTIONS\"\]\[\"periodic\"\] = .*?)```",
        page,
        re.S,
    )
    declared: dict = {}
    exec(settings_code, declared)
    exec(periodic_code, declared)
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shop", raising=False)
    monkeypatch.delitem(sys.modules, "shop.tasks", raising=False)
    with override_settings(TASKS=declared["TASKS"]):
        from shop import tasks as shop  # type: ignore[import-not-found]

        assert shop.send_receipt.max_attempts == 3
        assert shop.send_receipt.dont_retry == (ValueError,)
        assert shop.notify.queue_name == "emails" and shop.notify.priority == 50
        with InMemoryBroker() as broker:  # declares the queues of the tasks just imported
            result = shop.add.enqueue(2, 3)
            broker.run_until_idle()
        result.refresh()
        from django_rmq_retry.models import PeriodicTask
        from django_rmq_retry.tasks import periodic

        periodic.sync_declared()
        assert sorted(PeriodicTask.objects.values_list("name", "task_path")) == [
            ("nightly-receipts", "shop.tasks.send_receipt"),
            ("sum-every-minute", "shop.tasks.add"),
        ]
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


# Transactions ------------------------------------------------------------------------------
def _depth(rmq, task_name: str) -> int:
    queue = f"{rmq.prefix}.tasks.default.tests.tasksproject.tasks.{task_name}"
    return rmq.ch().queue_declare(queue, passive=True).method.message_count


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_a_task_enqueued_in_a_rolled_back_transaction_never_runs(rmq):
    from django.db import transaction

    call_command("rmq_consume", setup_only=True, verbosity=0)
    with pytest.raises(RuntimeError), transaction.atomic():
        doomed = t.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    kept = t.add.enqueue(2, 2)  # in autocommit: published now, a marker that we consumed
    consume("tasks.default.tests.tasksproject.tasks.add", count=1, idle=10)
    assert t.RUNS == [("add", 1, [2, 2])]
    assert _depth(rmq, "add") == 0  # nothing else was ever published
    assert not TaskResultRecord.objects.filter(id=doomed.id).exists()
    assert TaskResultRecord.objects.get(id=kept.id).status == "SUCCESSFUL"


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_a_task_enqueued_before_its_commit_runs_once_after_it(rmq):
    """The row is in the transaction, the message is not on the broker until the commit:
    a worker can never see the task before its row (the duplicate-key park of a worker
    that raced the commit)."""
    from django.db import transaction

    call_command("rmq_consume", setup_only=True, verbosity=0)
    with transaction.atomic():
        result = t.add.enqueue(20, 22)
        assert _depth(rmq, "add") == 0  # not published before the commit
    assert wait_for(lambda: _depth(rmq, "add") == 1, 30)
    consume("tasks.default.tests.tasksproject.tasks.add", count=1, idle=10)
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    assert t.RUNS == [("add", 1, [20, 22])]
    assert not ParkedMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_task_not_published_after_its_commit_is_failed_with_why(monkeypatch):
    from django.db import transaction

    from django_rmq_retry.core.errors import BrokerUnavailable

    with InMemoryBroker() as broker:

        def refuse(*args, **kwargs):
            raise BrokerUnavailable("no broker")

        monkeypatch.setattr(broker.publisher, "_send_batch", refuse)
        with pytest.raises(BrokerUnavailable), transaction.atomic():
            result = t.add.enqueue(1, 2)
    row = TaskResultRecord.objects.get(id=result.id)
    assert row.status == "FAILED"
    assert [e["exception_class_path"] for e in row.errors] == [
        "django_rmq_retry.core.errors.BrokerUnavailable"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_parked_task_is_failed_once_whatever_parked_it():
    """The result follows the consumer's park, for any cause, and task_finished is sent
    once: a second park signal of the same task (a redelivered park) changes nothing."""
    from django_rmq_retry.signals import message_parked

    finished = []

    def on_finished(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status))

    task_finished.connect(on_finished)
    try:
        with InMemoryBroker():
            result = t.add.enqueue(1, 2)  # not consumed: a park before it ever ran
        msg_body = bytes(
            json.dumps(
                {
                    "task": "tests.tasksproject.tasks.add",
                    "id": result.id,
                    "backend": "default",
                    "queue_name": "default",
                    "args": [1, 2],
                    "kwargs": {},
                    "enqueued_at": timezone.now().isoformat(),
                }
            ),
            "utf-8",
        )
        row = ParkedMessage(body=msg_body, error_type="", traceback="")
        sender = "tasks.default.tests.tasksproject.tasks.add"
        for created in (True, False):
            message_parked.send(sender=sender, parked=row, reason="delivery_limit", created=created)
    finally:
        task_finished.disconnect(on_finished)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.finished_at is not None
    assert finished == [(result.id, TaskResultStatus.FAILED)]


# run_after ---------------------------------------------------------------------------------
@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_run_after_beyond_the_delay_levels_runs_once_on_time(rmq):
    """Three levels of 100 ms hold 700 ms: a task due in 2.5 s goes round them again (the
    broker drops a message that dead-letters through a queue it already died in, unless
    each round is a fresh publish), across a consumer restart, and starts no earlier than
    its run_after."""
    from django.conf import settings

    small = {**settings.RMQ_RETRY, "DELAY_RESOLUTION_MS": 100, "DELAY_LEVELS": 3}
    with override_settings(RMQ_RETRY=small):
        call_command("rmq_consume", setup_only=True, verbosity=0)
        run_after = timezone.now() + timedelta(seconds=2.5)
        later = t.add.using(run_after=run_after).enqueue(5, 6)
        name = "tasks.default.tests.tasksproject.tasks.add"
        consume(name, count=1, idle=10)  # one round, then this consumer stops
        assert t.RUNS == []
        consume(name, count=50, idle=4)  # a new one: the rounds left, then the task
    later.refresh()
    assert later.status == TaskResultStatus.SUCCESSFUL and later.return_value == 11
    assert t.RUNS == [("add", 1, [5, 6])]
    assert later.started_at >= run_after
    assert not ParkedMessage.objects.exists()


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_real_broker_a_cancelled_deferred_task_never_runs(rmq):
    from django_rmq_retry.tasks import cancel

    call_command("rmq_consume", setup_only=True, verbosity=0)
    later = t.add.using(run_after=timezone.now() + timedelta(seconds=1.5)).enqueue(8, 8)
    marker = t.add.using(run_after=timezone.now() + timedelta(seconds=1.5)).enqueue(9, 9)
    assert cancel(later)
    consume("tasks.default.tests.tasksproject.tasks.add", count=2, idle=10)
    assert t.RUNS == [("add", 1, [9, 9])]  # the marker ran; the cancelled one was acked
    assert _depth(rmq, "add") == 0
    assert TaskResultRecord.objects.get(id=later.id).status == "CANCELLED"
    marker.refresh()
    assert marker.return_value == 18
