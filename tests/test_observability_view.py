"""The web side's ``metrics`` view (``django_rmq_retry.observability.urls``)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.urls import include, path
from django.utils import timezone

from django_rmq_retry.models import OutboxMessage, ParkedMessage

pytest.importorskip("prometheus_client")

urlpatterns = [path("internal/", include("django_rmq_retry.observability.urls"))]


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_metrics_view_exports_parked_and_outbox_backlogs(client, monkeypatch):
    from django_rmq_retry.observability import views

    monkeypatch.setattr(views, "_collector", None)  # no cache from another test
    now = timezone.now()
    for i, status in enumerate(["parked", "parked", "parked", "requeued"]):
        ParkedMessage.objects.create(
            park_key=f"k{i}",
            receiver="app.consumers.charge",
            queue="q",
            body=b"{}",
            reason="max_attempts",
            parked_at=now,
            status=status,
        )
    OutboxMessage.objects.create(
        group="g", routing_key="x", body=b"{}", created_at=now, available_at=now
    )
    answer = client.get("/internal/metrics")
    assert answer.status_code == 200
    text = answer.content.decode()
    print(text)
    assert (
        'django_rmq_retry_parked_messages{receiver="app.consumers.charge",status="parked"} 3.0'
        in text
    )
    assert (
        'django_rmq_retry_parked_messages{receiver="app.consumers.charge",status="requeued"} 1.0'
        in text
    )
    assert 'django_rmq_retry_outbox_messages{status="pending"} 1.0' in text


@pytest.mark.parametrize(
    "key, value",
    [("METRICS_PORT", "9100"), ("METRICS_PORT", 70000), ("TRACING", "yes"), ("HEALTH_DIR", "")],
)
def test_bad_observability_settings_are_refused_by_the_checks(key, value, settings):
    from django_rmq_retry.checks import check_settings

    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, key: value}):
        ids = [m.id for m in check_settings()]
    assert "django_rmq_retry.E016" in ids


def test_good_observability_settings_pass_the_checks(settings):
    from django_rmq_retry.checks import check_settings

    good = {"METRICS_PORT": 9100, "TRACING": True, "HEALTH_DIR": "/tmp/h", "LIVENESS_TIMEOUT": 30}
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, **good}):
        assert [m.id for m in check_settings()] == []
