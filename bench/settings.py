"""Settings for the benchmarks: the demo project plus the bench-only receivers.

Everything the benchmark touches carries the per-run prefix ``RMQ_PREFIX`` (set by
``bench/run.py``), so a run never collides with the demo, the tests or another run, and its
cleanup deletes exactly its own queues and exchanges.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS, RMQ_RETRY, env

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

# Production-like: DEBUG=True would wrap every query in CursorDebugWrapper and log it.
DEBUG = env.bool("BENCH_DEBUG", default=False)

RMQ_RETRY = {
    **RMQ_RETRY,
    "PREFIX": env("RMQ_PREFIX", default="rmq_bench"),
    "PREFETCH": env.int("BENCH_PREFETCH", default=20),
    "ASYNC_CONCURRENCY": env.int("BENCH_ASYNC_CONCURRENCY", default=100),
    "ASYNC_ON_IO_LOOP": env.bool("BENCH_ASYNC_ON_IO_LOOP", default=False),
}
if "BENCH_LANDING_MS" in env.ENVIRON:  # unset: the product's default landing
    RMQ_RETRY["DELAY_LANDING_MS"] = env.int("BENCH_LANDING_MS")

# Django's default CONN_MAX_AGE=0 closes the connection after every message (the consumer
# calls close_old_connections() around each one, like a request); the parking benchmark
# runs once with the default and once with persistent connections.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("BENCH_CONN_MAX_AGE", default=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_rmq_retry": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# The observability scenario: metrics (--metrics-port) and traces on. Traces go through the
# OpenTelemetry SDK with a batch processor to an exporter that drops them: what a project
# pays short of its network exporter. BENCH_TRACING=1: the SDK's default sampler (every
# trace without a parent recorded: the worst case); BENCH_TRACING=0.1: a project's
# ParentBased(TraceIdRatioBased(0.1)), one trace in ten recorded.
_tracing = env.float("BENCH_TRACING", default=0.0)
if _tracing:
    RMQ_RETRY["TRACING"] = True
    from opentelemetry import trace as _trace
    from opentelemetry.sdk.trace import TracerProvider as _Provider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor as _Batch
    from opentelemetry.sdk.trace.export import SpanExporter as _Exporter
    from opentelemetry.sdk.trace.export import SpanExportResult as _Result
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class _Drop(_Exporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return _Result.SUCCESS

    _sampled = {} if _tracing >= 1 else {"sampler": ParentBased(TraceIdRatioBased(_tracing))}
    _provider = _Provider(**_sampled)
    _provider.add_span_processor(_Batch(_Drop()))
    _trace.set_tracer_provider(_provider)
