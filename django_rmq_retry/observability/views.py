"""The web side's ``metrics`` view: the parked backlog and the outbox backlog for Prometheus.

A consumer's own counters are served by ``rmq_consume --metrics-port``; these two gauges
describe the database, so any web process can serve them (read from the kept group counts
and along the outbox's index, cached 5 s per process). The view is not permission-gated: it
is meant for an internal URL a Prometheus scrapes (``path("internal/", include(
"django_rmq_retry.observability.urls"))`` behind the ingress), and names receivers and
counts only, never a message. Needs the ``prometheus`` extra.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

_collector = None


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from .metrics import DatabaseCollector

    global _collector
    if _collector is None:
        _collector = DatabaseCollector(own_thread=False)
    registry = CollectorRegistry()
    registry.register(_collector)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
