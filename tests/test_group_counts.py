"""The kept per-group counts of parked rows (#16): the database keeps them right through
every way rows change, also under concurrent writers, and ``rmq_recount_parked`` repairs
them. Runs on SQLite (row triggers) and PostgreSQL (statement triggers)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections

from django_rmq_retry import parking
from django_rmq_retry.core.names import Names
from django_rmq_retry.models import ParkedGroupCount, ParkedMessage, ParkedStatus
from django_rmq_retry.parking import group_counts
from tests.conftest import ConfirmAll
from tests.test_parking import _request

pytestmark = pytest.mark.django_db(transaction=True)

NAMES = Names("p")


def kept() -> dict[tuple[str, str, str, str], int]:
    return {
        (g.receiver, g.fingerprint, g.error_type, g.status): g.count
        for g in ParkedGroupCount.objects.all()
        if g.count
    }


def computed() -> dict[tuple[str, str, str, str], int]:
    counts: dict[tuple[str, str, str, str], int] = {}
    for row in ParkedMessage.objects.values("receiver", "fingerprint", "error_type", "status"):
        key = (row["receiver"], row["fingerprint"], row["error_type"], row["status"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def req(i: int, group: str = "ValueError at a.py:f", **kw) -> parking.ParkRequest:
    return _request(body=f'{{"id": {i}}}'.encode(), fingerprint=group, **kw)


def test_counts_follow_park_requeue_discard_purge_and_raw_sql():
    parking.park(req(0), names=NAMES)
    parking.park_many([req(i) for i in range(1, 6)], names=NAMES)  # one group commit
    parking.park_many(
        [req(i, "KeyError at b.py:g", error_type="KeyError") for i in range(6, 9)], names=NAMES
    )
    assert kept() == computed()
    assert [(g["fingerprint"], g["count"]) for g in parking.summary()] == [
        ("ValueError at a.py:f", 6),
        ("KeyError at b.py:g", 3),
    ]
    assert parking.parked_total() == 9

    group = ParkedMessage.objects.filter(fingerprint="ValueError at a.py:f")
    first_four = ParkedMessage.objects.filter(pk__in=list(group.values_list("pk", flat=True)[:4]))
    result = parking.requeue(first_four, publisher=ConfirmAll())
    assert result.requeued == 4
    assert kept() == computed()
    assert parking.discard(ParkedMessage.objects.filter(error_type="KeyError")) == 3
    assert kept() == computed()
    # The same delivery parked again (a redelivery after a lost ack) changes no count.
    parking.park(req(1), names=NAMES)
    assert kept() == computed()
    ParkedMessage.objects.update(
        parked_at=ParkedMessage.objects.first().parked_at - timedelta(days=40)
    )
    done = ParkedMessage.objects.exclude(status=ParkedStatus.PARKED).count()
    assert parking.purge(timedelta(days=30)) == done == 7  # requeued and discarded rows
    assert kept() == computed()
    ParkedMessage.objects.filter(pk=ParkedMessage.objects.first().pk).update(receiver="other")
    assert kept() == computed()
    assert [(g["fingerprint"], g["count"]) for g in parking.summary()] == [
        (g["fingerprint"], g["count"]) for g in parking.summary(ParkedMessage.objects.all())
    ]


def test_recount_repairs_counts_and_the_triggers():
    parking.park_many([req(i) for i in range(4)], names=NAMES)
    ParkedGroupCount.objects.update(count=99)
    with connection.cursor() as cursor:  # as a table rebuild on SQLite would
        cursor.execute(
            "DROP TRIGGER IF EXISTS rmqr_groups_insert"
            + (" ON django_rmq_retry_parkedmessage" if connection.vendor == "postgresql" else "")
        )
    parking.park(req(10), names=NAMES)  # not counted: no trigger
    assert kept() != computed()
    group_counts._triggers_seen.clear()  # what a minute's wait does in another process
    assert not parking.counts_kept()  # so the failure groups are grouped from the rows
    assert [(g["fingerprint"], g["count"]) for g in parking.summary()] == [
        ("ValueError at a.py:f", 5)
    ]
    assert parking.parked_total() is None
    out = __import__("io").StringIO()
    call_command("rmq_recount_parked", stdout=out)
    assert "recounted 1 group(s)" in out.getvalue()
    assert (
        kept()
        == computed()
        == {("tests.testapp.consumers.alpha", "ValueError at a.py:f", "ValueError", "parked"): 5}
    )
    parking.park(req(11), names=NAMES)  # the trigger is back
    assert kept() == computed()
    assert parking.counts_kept() and parking.parked_total() == 6


def test_concurrent_parking_requeue_and_discard_keep_counts_exact():
    parking.park_many([req(i) for i in range(200)], names=NAMES)
    errors: list[BaseException] = []

    def run(fn):
        def target():
            try:
                fn()
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        return threading.Thread(target=target)

    def parker(start):
        return lambda: [
            parking.park_many([req(start + i * 10 + j) for j in range(10)], names=NAMES)
            for i in range(10)
        ]

    threads = [
        run(parker(1000)),
        run(parker(2000)),
        run(
            lambda: parking.requeue(
                ParkedMessage.objects.filter(pk__lte=120), publisher=ConfirmAll(), batch_size=25
            )
        ),
        run(lambda: parking.discard(ParkedMessage.objects.filter(pk__gt=100), batch_size=20)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert ParkedMessage.objects.count() == 400
    assert kept() == computed()


def _trigger_definitions() -> dict[str, str]:
    """The count-keeping triggers as the database holds them, whitespace folded."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT t.tgname, pg_get_triggerdef(t.oid) || ' ' || pg_get_functiondef(t.tgfoid) "
                "FROM pg_trigger t WHERE t.tgname LIKE 'rmqr_groups_%%'"
            )
        else:
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
                "AND name LIKE 'rmqr_groups_%%'"
            )
        return {name: " ".join(sql.replace("(", " ( ").split()) for name, sql in cursor}


def test_the_migrations_triggers_are_the_ones_recount_installs():
    """The frozen migration writes its trigger SQL out (it imports nothing of the package);
    ``rmq_recount_parked`` reinstalls them from ``group_counts``: the two must not drift."""
    migrated = _trigger_definitions()
    assert len(migrated) == 3
    group_counts.recount()
    assert _trigger_definitions() == migrated
