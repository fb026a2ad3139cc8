"""The changelist's range filters: parked between, last failed between, attempts >= N.

Each is one range on an indexed column; on PostgreSQL the plan of a filtered page is an
index read (never a sequential scan of the parked table), which this test asserts with
EXPLAIN on a table large enough for the planner to care.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.test_admin import changelist_queries, make_row, operator

pytestmark = pytest.mark.django_db


def ids(response) -> set[int]:
    return {row.pk for row in response.context["cl"].result_list}


def test_range_filters_select_the_rows_in_range(client):
    now = timezone.now().replace(microsecond=0)
    old = make_row(
        parked_at=now - timedelta(days=3), last_failure_at=now - timedelta(days=3), attempts=2
    )
    mid = make_row(
        parked_at=now - timedelta(hours=5), last_failure_at=now - timedelta(hours=6), attempts=5
    )
    new = make_row(parked_at=now, last_failure_at=now, attempts=9)
    client.force_login(operator())
    fmt = "%Y-%m-%dT%H:%M:%S"
    day_ago = (timezone.localtime(now) - timedelta(days=1)).strftime(fmt)
    hour_ago = (timezone.localtime(now) - timedelta(hours=1)).strftime(fmt)
    response, _ = changelist_queries(client, parked_from=day_ago)
    assert ids(response) == {mid.pk, new.pk}
    response, _ = changelist_queries(client, parked_from=day_ago, parked_to=hour_ago)
    assert ids(response) == {mid.pk}
    response, _ = changelist_queries(client, failed_to=hour_ago)
    assert ids(response) == {old.pk, mid.pk}
    response, _ = changelist_queries(client, attempts_min="5")
    assert ids(response) == {mid.pk, new.pk}
    response, _ = changelist_queries(
        client, attempts_min="5", failed_from=day_ago, status__exact="parked"
    )
    assert ids(response) == {mid.pk, new.pk}
    # A date alone is midnight; the sidebar keeps the other filters in its form.
    response, _ = changelist_queries(
        client, parked_to=timezone.localtime(now).date().isoformat(), attempts_min="1"
    )
    assert old.pk in ids(response) and new.pk not in ids(response)
    html = response.content.decode()
    assert 'name="attempts_min" value="1"' in html
    assert 'type="hidden" name="attempts_min" value="1"' in html  # kept by the other forms
    # Nonsense is refused the admin's way (?e=1), nothing is raised.
    bad = client.get("/admin/django_rmq_retry/parkedmessage/?attempts_min=lots")
    assert bad.status_code == 302 and "e=1" in bad["Location"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the plan is PostgreSQL's")
def test_a_filtered_page_reads_an_index_not_the_table(client):
    from django_rmq_retry.models import ParkedMessage

    now = timezone.now()
    rows = [
        ParkedMessage(
            park_key=f"k{i}",
            receiver="r",
            queue="q",
            body=b"{}",
            reason="exhausted",
            attempts=i % 20,
            parked_at=now - timedelta(minutes=i),
            last_failure_at=now - timedelta(minutes=i),
        )
        for i in range(20_000)
    ]
    ParkedMessage.objects.bulk_create(rows, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_rmq_retry_parkedmessage")
    queries = [
        ParkedMessage.objects.filter(attempts__gte=19).order_by("-parked_at", "-id")[:50],
        ParkedMessage.objects.filter(last_failure_at__gte=now - timedelta(hours=1)).order_by(
            "-parked_at", "-id"
        )[:50],
        ParkedMessage.objects.filter(parked_at__gte=now - timedelta(hours=2)).order_by(
            "-parked_at", "-id"
        )[:50],
    ]
    for qs in queries:
        plan = qs.explain()
        assert "Seq Scan on django_rmq_retry_parkedmessage" not in plan, plan
        assert "Index" in plan, plan
