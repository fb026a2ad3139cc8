"""The enqueuer's side of the ``tasks`` benchmark, run by ``bench/tasks.py`` in the venv of the
backend under test (``BENCH_TASKS_BACKEND``, settings ``bench.tasks_settings``):

    tasks_side.py enqueue TASK N IDS     # enqueue N tasks (no worker running); ids to IDS
    tasks_side.py wait N IDS POLLS       # poll until N more results are SUCCESSFUL, then
                                         # read every one back through the backend

``wait`` is what the enqueuer sees: it counts the backend's own results table (one
``COUNT`` every 20 ms, each poll's time and count written to ``POLLS``), and once all are
there reads each result with ``default_task_backend.get_result(id)``: every one must be
SUCCESSFUL (and the retried task's return value its second attempt). It prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

POLL_EVERY = 0.02


def setup() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.tasks_settings")
    import django

    django.setup()
    return os.environ.get("BENCH_TASKS_BACKEND", "ours")


def counts(backend: str) -> tuple[int, int]:
    """(successful, failed) rows in ``backend``'s results table."""
    if backend == "ours":
        from django_rmq_retry.models import TaskResultRecord as Model

        ok, bad = "SUCCESSFUL", "FAILED"
    elif backend == "db":
        from django_tasks_db.models import DBTaskResult as Model  # type: ignore[no-redef]

        ok, bad = "SUCCESSFUL", "FAILED"
    elif backend == "ox":
        from django_ox.models import OxTask as Model  # type: ignore[no-redef]

        ok, bad = "SUCCESSFUL", "FAILED"
    else:  # Celery's database result backend (its table, not a Django model)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT status, count(*) FROM celery_taskmeta GROUP BY status")
            celery = dict(cursor.fetchall())
        return celery.get("SUCCESS", 0), celery.get("FAILURE", 0)
    from django.db.models import Count

    by = dict(
        Model.objects.filter(status__in=[ok, bad])
        .order_by()
        .values_list("status")
        .annotate(n=Count("pk"))
        .values_list("status", "n")
    )
    return by.get(ok, 0), by.get(bad, 0)


def enqueue(task_name: str, n: int, ids_path: Path) -> dict[str, Any]:
    backend = setup()
    from bench.tasksapp.tasks import names

    task = names()[task_name]
    if backend == "ours":  # a deploy step: the task's queue exists before the first enqueue
        from django_rmq_retry.broker import connect
        from django_rmq_retry.conf import current_plan
        from django_rmq_retry.registry import default_registry

        plan = current_plan(default_registry.all())
        conn = connect()
        conn.channel().declare(plan)
        conn.close()
        queues = [q.name for q in plan.queues]
    else:
        queues = []
    if backend == "celery":  # Celery creates its results table on first use: before counting
        from bench.tasksapp.celery_app import app

        app.backend.get_task_meta("none")
    ids = []
    start = time.perf_counter()
    for i in range(n):
        ids.append(task.enqueue(i).id)
    seconds = time.perf_counter() - start
    ids_path.write_text(json.dumps({"task": task_name, "ids": ids}))
    return {"seconds": seconds, "queues": queues}


def wait(n: int, ids_path: Path, polls_path: Path, timeout: float) -> dict[str, Any]:
    backend = setup()
    from django.db import close_old_connections

    base, base_failed = counts(backend)
    polls: list[tuple[float, int]] = []
    print("ready", flush=True)  # the benchmark starts the workers after this line
    deadline = time.monotonic() + timeout
    while True:
        ok, failed = counts(backend)
        polls.append((time.time(), ok - base))
        if ok - base >= n or failed > base_failed or time.monotonic() > deadline:
            break
        time.sleep(POLL_EVERY)
    polls_path.write_text(json.dumps(polls))
    if failed > base_failed:
        raise SystemExit(f"{failed - base_failed} task(s) FAILED")
    if ok - base < n:
        raise SystemExit(f"timed out: {ok - base} of {n} results SUCCESSFUL")
    close_old_connections()
    return {"checked": check(ids_path)}


def check(ids_path: Path) -> int:
    """Read every result back through the backend, as the enqueuer would."""
    try:
        from django.tasks import default_task_backend
    except ImportError:  # Django 5.2: the django-tasks backport
        from django_tasks import default_task_backend  # type: ignore[no-redef]

    data = json.loads(ids_path.read_text())
    for result_id in data["ids"]:
        result = default_task_backend.get_result(result_id)
        if str(result.status) not in ("SUCCESSFUL", "TaskResultStatus.SUCCESSFUL"):
            raise SystemExit(f"{result_id}: {result.status}, not SUCCESSFUL")
        if data["task"] == "fail_once" and result.return_value != 2:
            raise SystemExit(f"{result_id}: succeeded on attempt {result.return_value}, not 2")
    return len(data["ids"])


def main(argv: list[str]) -> None:
    if argv[0] == "enqueue":
        out = enqueue(argv[1], int(argv[2]), Path(argv[3]))
    elif argv[0] == "wait":
        out = wait(int(argv[1]), Path(argv[2]), Path(argv[3]), float(argv[4]))
    else:
        raise SystemExit(f"unknown command {argv[0]!r}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(sys.argv[1:])
