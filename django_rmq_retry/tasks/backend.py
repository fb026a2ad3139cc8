"""``RabbitMQBackend``: Django's task API on our broker (``django.tasks`` on Django 6.0+, the
``django-tasks`` backport on Django 5.2: ``api``).

A task is a receiver the consumer already knows: each (queue name, task path) pair owns a
queue ``<PREFIX>.tasks.<queue_name>.<module.path>`` bound to the routing key
``tasks.<queue_name>.<module.path>`` on the work exchange, and its receiver
(:class:`~.runner.TaskRunner`) runs the task. So ``rmq_consume`` runs tasks beside
receivers, with the same retries through the delay levels, the same parking, admin and
requeue; there is no second worker loop.

``OPTIONS`` (all optional)::

    "outbox": False        # True: enqueue writes an outbox row in the current transaction
    "results": True        # False: no results table row is written, get_result raises
    "result_retention": 7 * 24 * 3600   # seconds a finished result is kept
    "retry": {...}         # default retry policy of this backend's tasks (Policy fields)
    "backoff": callable    # default backoff(exception, task_result) -> seconds | None, or
                           # its dotted path (a task's own backoff= wins)
    "periodic": {name: {"task": "app.tasks.f", "every": 60 | "cron": "0 3 * * *",
                        "args": [], "kwargs": {}}}   # periodic tasks (``periodic``)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import get_random_string

from ..core.backoff import Policy
from ..core.delays import epoch_us
from ..registry import Registry, default_registry
from ..topics import Topic
from . import parked, results
from .api import BaseTaskBackend, Task, TaskResult, normalize_json, task_enqueued
from .defer import publish_deferred
from .periodic import check_spec as periodic_spec
from .results import READY
from .runner import runner_for
from .task_message import MAX_PRIORITY, TaskMessage, amqp_priority, receiver_name

DEFAULT_RETENTION = 7 * 24 * 3600


@dataclass(frozen=True, slots=True, kw_only=True)
class RabbitMQTask(Task):
    """A task with our retry policy (``@task(max_attempts=3, retry={...}, dont_retry=...)``).

    ``max_attempts`` and ``dont_retry`` (exception classes or dotted paths parked at once)
    override ``retry`` (a :class:`~django_rmq_retry.Policy` or a dict of its fields), which
    overrides the backend's ``OPTIONS["retry"]`` and then the ``RETRY`` setting. A
    ``RetryPolicy`` row in the admin for the task's receiver wins over all of them.
    """

    max_attempts: int | None = None
    retry: Policy | Mapping[str, Any] | None = field(default=None, compare=False)
    dont_retry: tuple[Any, ...] = ()
    #: ``backoff(exception, task_result)`` -> seconds (or a ``timedelta``) before the next
    #: attempt, or ``None``: no more attempts (parked). ``max_attempts`` still bounds them.
    backoff: Callable[[BaseException, Any], Any] | str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.retry is not None and not isinstance(self.retry, Policy):
            object.__setattr__(self, "retry", Policy.from_mapping(self.retry))
        if not isinstance(self.dont_retry, tuple):
            object.__setattr__(self, "dont_retry", tuple(self.dont_retry))
        Task.__post_init__(self)

    def policy(self, default: Policy | None) -> Policy | None:
        """This task's own policy over ``default`` (``None``: the receiver default)."""
        base = self.retry if isinstance(self.retry, Policy) else default
        changes: dict[str, Any] = {}
        if self.max_attempts is not None:
            changes["max_attempts"] = self.max_attempts
        if self.dont_retry:
            changes["dont_retry"] = self.dont_retry
        if not changes:
            return base
        return (base or _settings_policy()).replace(**changes)


def _settings_policy() -> Policy:
    from ..registry.policies import default_policy

    return default_policy()


class RabbitMQBackend(BaseTaskBackend):
    """See the module docstring."""

    task_class = RabbitMQTask
    supports_defer = True
    supports_async_task = True
    supports_priority = True
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        unknown = set(options) - {
            "outbox",
            "results",
            "result_retention",
            "retry",
            "backoff",
            "periodic",
            "registry",
        }
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: unknown option(s) {', '.join(sorted(unknown))}"
            )
        self.outbox: bool = bool(options.get("outbox", False))
        self.results: bool = bool(options.get("results", True))
        self.supports_get_result = self.results
        self.retention = timedelta(
            seconds=float(options.get("result_retention", DEFAULT_RETENTION))
        )
        retry = options.get("retry")
        try:
            self.default_policy = (
                Policy.from_mapping(retry) if isinstance(retry, Mapping) else retry
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['retry']: {exc}") from exc
        self.registry: Registry = options.get("registry") or default_registry
        self.backoff: Any = options.get("backoff")
        for name, spec in (options.get("periodic") or {}).items():
            try:
                periodic_spec(str(name), spec)
            except ValueError as exc:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: {exc}") from exc
        parked.connect()  # a parked task's result: FAILED, then task_finished

    # Declaring ---------------------------------------------------------------------------
    def validate_task(self, task: Task) -> None:
        """Django's checks, then the task's receivers: one per queue name in ``QUEUES``.

        Every queue name gets a queue, so a consumer that imported the task consumes it
        whatever ``.using(queue_name=...)`` a publisher picks."""
        super().validate_task(task)
        policy = task.policy(self.default_policy) if isinstance(task, RabbitMQTask) else None
        for queue_name in sorted(self.queues or {task.queue_name}):
            rec = self.registry.register(
                runner_for(
                    queue_name, task.module_path, is_async=inspect.iscoroutinefunction(task.func)
                ),
                [Topic(receiver_name(queue_name, task.module_path))],
                retry=policy,
            )
            rec.max_priority = MAX_PRIORITY

    # Enqueueing --------------------------------------------------------------------------
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Enqueue as Django's transactions mean it.

        Outside a transaction: the result row is committed, then the task is published with
        a confirm (no row is left if that fails). Inside ``atomic()``: the row is written in
        that transaction and the task is published once it commits (``on_commit``), so no
        worker can run it before its row is visible, and a rollback leaves neither row nor
        task. With ``outbox``: the task is an outbox row in the same transaction, sent if
        and only if it commits, even if this process dies right after the commit.
        """
        self.validate_task(task)
        now = timezone.now()
        msg = TaskMessage(
            result_id=get_random_string(32),
            task_path=task.module_path,
            backend=self.alias,
            queue_name=task.queue_name,
            priority=task.priority,
            args=list(normalize_json(list(args))),  # type: ignore[arg-type]
            kwargs=dict(normalize_json(dict(kwargs))),  # type: ignore[arg-type]
            takes_context=task.takes_context,
            run_after=task.run_after,
            enqueued_at=now,
        )
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=msg.result_id,
            status=READY,
            enqueued_at=now,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=msg.args,
            kwargs=msg.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        db = results.database()
        if self.results:
            results.write_enqueued(msg)
        if not self.outbox and transaction.get_connection(db).in_atomic_block:
            transaction.on_commit(
                functools.partial(self._publish_committed, msg, result), using=db, robust=False
            )
            return result
        try:
            self._send(msg)
        except Exception:  # not enqueued (refused, broker down, outbox write failed): no row
            if self.results:
                results.forget(msg.result_id)
            raise
        task_enqueued.send(type(self), task_result=result)
        return result

    def _publish_committed(self, msg: TaskMessage, result: TaskResult) -> None:
        """After the enqueuing transaction committed: publish. If that fails the row stays
        (it was committed) but says FAILED, with why, and the error reaches the caller."""
        try:
            self._send(msg)
        except Exception as exc:
            if self.results:
                results.not_sent(msg.result_id, exc)
            raise
        task_enqueued.send(type(self), task_result=result)

    def _send(self, msg: TaskMessage) -> None:
        topic = Topic(receiver_name(msg.queue_name, msg.task_path))
        props: dict[str, Any] = {
            "message_id": msg.result_id,
            "priority": amqp_priority(msg.priority),
        }
        if self.outbox:
            # The outbox publishes to the work exchange; a deferred task's runner sends it
            # on through the delay levels when it arrives early (``runner``).
            topic.send(msg.body(), outbox=True, **props)
        elif msg.run_after is not None and msg.run_after > timezone.now():
            publish_deferred(topic.routing_key, msg.body(), props, epoch_us(msg.run_after))
        else:
            topic.send(msg.body(), outbox=False, **props)

    # Results -----------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        if not self.results:
            raise NotImplementedError(
                f"TASKS[{self.alias!r}] keeps no results (OPTIONS['results'] is False)."
            )
        record = results.get(result_id, self.alias)
        task = _task(record.task_path, record.queue_name, record.priority, record.run_after)
        return results.as_result(record, task)


def _task(path: str, queue_name: str, priority: int, run_after: datetime | None) -> Task:
    """The ``Task`` a message names, with the options it was enqueued with."""
    from django.utils.module_loading import import_string

    task = import_string(path)
    if not isinstance(task, Task):
        raise TypeError(f"{path} is not a task (decorate it with @task)")
    return task.using(queue_name=queue_name, priority=priority, run_after=run_after)
