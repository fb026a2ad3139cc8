"""A task message: what ``enqueue`` publishes and the worker reads.

The body is JSON (the task's dotted path, its JSON arguments, the result id and the
options it was enqueued with); the AMQP ``message_id`` is the result id, so a parked task
is found by it. Pure: no Django, no broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Priorities of a task queue (``x-max-priority``): Django's -100..100 in 21 steps of 10
#: would cost the broker 21 sub-queues per queue for little; 11 are plenty.
MAX_PRIORITY = 10
#: The routing key (and queue) family of tasks under the work exchange and PREFIX.
KIND = "tasks"


def amqp_priority(priority: int) -> int:
    """Django's priority (-100..100, default 0) as a RabbitMQ one (0..10, default 5).

    Steps of 20 around the default: -100..-91 -> 0, -90..-71 -> 1, ..., -10..9 -> 5, ...,
    90..100 -> 10, so the default lands in the middle and both ends are reachable."""
    clamped = max(-100, min(100, int(priority)))
    return (clamped + 100 + 10) // 20


def receiver_name(queue_name: str, task_path: str) -> str:
    """The receiver (and queue suffix, routing key) of ``task_path`` in ``queue_name``."""
    return f"{KIND}.{queue_name}.{task_path}"


@dataclass(frozen=True)
class TaskMessage:
    """A task as it travels: everything a worker needs to rebuild its ``TaskResult``."""

    result_id: str
    task_path: str
    backend: str
    queue_name: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    takes_context: bool
    run_after: datetime | None
    enqueued_at: datetime

    def body(self) -> dict[str, Any]:
        return {
            "task": self.task_path,
            "id": self.result_id,
            "backend": self.backend,
            "queue_name": self.queue_name,
            "priority": self.priority,
            "args": self.args,
            "kwargs": self.kwargs,
            "takes_context": self.takes_context,
            "run_after": self.run_after.isoformat() if self.run_after else None,
            "enqueued_at": self.enqueued_at.isoformat(),
        }

    @classmethod
    def from_body(cls, body: Any) -> TaskMessage:
        """Read a body (``ValueError`` if it is not a task message: the worker parks it)."""
        if not isinstance(body, dict):
            raise ValueError("a task message is a JSON object")
        try:
            run_after = body.get("run_after")
            return cls(
                result_id=str(body["id"]),
                task_path=str(body["task"]),
                backend=str(body["backend"]),
                queue_name=str(body["queue_name"]),
                priority=int(body.get("priority", 0)),
                args=list(body.get("args") or []),
                kwargs=dict(body.get("kwargs") or {}),
                takes_context=bool(body.get("takes_context", False)),
                run_after=datetime.fromisoformat(run_after) if run_after else None,
                enqueued_at=datetime.fromisoformat(body["enqueued_at"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a task message: {exc!r}") from exc
