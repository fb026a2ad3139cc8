"""Observability of django-rmq-retry: Prometheus metrics, OpenTelemetry traces, health probes.

Imported only when a project turns a part on (``rmq_consume --metrics-port``, ``--health-dir``,
the ``TRACING`` setting); the consumer reaches it only through ``django_rmq_retry.hooks``.
prometheus-client (the ``prometheus`` extra) and opentelemetry-api (the ``otel`` extra) are
imported by the parts that need them, never by this module. See docs/howto/observability.md.
"""

from __future__ import annotations

import os
from typing import Any

from ..conf import current_names
from ..hooks import CHILD_DIR_ENV, install
from .health import Health
from .observer import Observer

REQUEUE_UID = "django_rmq_retry.observability.requeue"


def missing_extra(module: str, extra: str) -> str | None:
    """A sentence to tell the user when ``module`` (of ``extra``) is not installed."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return (
            f"{module} is not installed: pip install 'django-rmq-retry[{extra}]' "
            f"(or pip install {module.replace('_', '-')})."
        )
    return None


def enable(
    *,
    metrics: bool,
    tracing: bool,
    liveness_timeout: float,
    health_dir: str | None = None,
) -> Observer:
    """Install the hooks of this consumer process and return them.

    ``metrics``: count into a private registry (``observer.metrics.registry``), or, in a
    child of ``--processes N``, into the supervisor's multiprocess directory. Health is
    always kept (cheap): files in ``health_dir``, or ``live-<pid>`` files for the supervisor.
    """
    child_dir = os.environ.get(CHILD_DIR_ENV)
    if child_dir:
        health = Health(liveness_timeout, child_dir, suffix=f"-{os.getpid()}")
    else:
        health = Health(liveness_timeout, health_dir)
    consumer_metrics = None
    if metrics:
        from prometheus_client import CollectorRegistry

        from .metrics import ConsumerMetrics

        registry = CollectorRegistry()
        consumer_metrics = ConsumerMetrics(registry, current_names())
    tracer = None
    if tracing:
        from .tracing import Tracing

        tracer = Tracing(current_names())
    observer = Observer(current_names(), metrics=consumer_metrics, tracing=tracer, health=health)
    _install(observer)
    return observer


def _install(observer: Observer) -> None:
    """Make ``observer`` this process's hooks (and, with tracing, follow requeues)."""
    from ..signals import message_requeued

    message_requeued.disconnect(dispatch_uid=REQUEUE_UID)
    if observer.tracing is not None:
        message_requeued.connect(observer.requeued, weak=False, dispatch_uid=REQUEUE_UID)
    install(observer)


def enable_tracing() -> Observer:
    """Trace ``send`` in this process (a web or worker process that publishes): call it
    from your project's start-up (an ``AppConfig.ready``, ``wsgi.py``) after setting up the
    OpenTelemetry SDK. ``rmq_consume`` needs no call: the ``TRACING`` setting turns it on
    there. A library never changes a project's start-up, so this is not done for you."""
    from .tracing import Tracing

    observer = Observer(current_names(), tracing=Tracing(current_names()))
    _install(observer)
    return observer


def disable() -> None:
    """Back to no hooks (the command calls it when the consumer returns)."""
    from ..signals import message_requeued

    message_requeued.disconnect(dispatch_uid=REQUEUE_UID)
    install(None)


def serve_consumer(observer: Observer, address: str, port: int) -> Any:
    """Serve one consumer process's metrics (with the database gauges) and probes."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from .metrics import DatabaseCollector
    from .server import serve

    registry = observer.metrics.registry
    registry.register(DatabaseCollector())

    def exposition() -> tuple[bytes, str]:
        return generate_latest(registry), CONTENT_TYPE_LATEST

    assert observer.health is not None
    return serve(address, port, exposition, observer.health)


def serve_supervisor(directory: str, pids: Any, address: str, port: int, timeout: float) -> Any:
    """Serve the children's summed samples (multiprocess mode) and their joint health."""
    from .health import ChildrenHealth
    from .multiprocess import exposition_of
    from .server import serve

    health = ChildrenHealth(directory, pids, timeout)
    return serve(address, port, exposition_of(directory, pids), health)
