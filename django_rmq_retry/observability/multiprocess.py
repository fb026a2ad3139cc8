"""``rmq_consume --processes N`` with metrics: one endpoint, on the supervisor.

The supervisor gives its children ``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory of its
own unless the environment names one): prometheus-client in each child then writes its
samples to files there, and the supervisor sums them per scrape (``MultiProcessCollector``),
so each message is counted once whichever child settled it and a restarted child's counts
stay in the totals. Gauges of children that exited are dropped (``mark_process_dead``)
before each scrape. Chosen over children pushing to the parent: no protocol of ours, the
way gunicorn deployments already run prometheus-client.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from .metrics import DatabaseCollector

ENV = "PROMETHEUS_MULTIPROC_DIR"
_PID = re.compile(r"_(\d+)\.db$")


def prepare_directory() -> str:
    """The directory for the children's files, emptied (stale files would add to the sums)."""
    directory = os.environ.get(ENV) or tempfile.mkdtemp(prefix="django-rmq-retry-metrics-")
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    return directory


def exposition_of(directory: str, pids: Callable[[], list[int]]) -> Callable[[], tuple[bytes, str]]:
    database = DatabaseCollector()

    def exposition() -> tuple[bytes, str]:
        alive = set(pids())
        for name in os.listdir(directory):
            match = _PID.search(name)
            if match and name.startswith("gauge_live") and int(match.group(1)) not in alive:
                multiprocess.mark_process_dead(int(match.group(1)), directory)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        registry.register(database)
        return generate_latest(registry), CONTENT_TYPE_LATEST

    return exposition
