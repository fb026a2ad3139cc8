"""Orphan queues of ordered receivers: the partition queues are what an ordered receiver
owns. They are remembered and never reported while it reads them; renaming it, making a
plain receiver ordered, or lowering ``ORDERING_PARTITIONS`` leaves queues behind that are."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry import Topic, receiver
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.ordering import partition_of
from django_rmq_retry.models import DeclaredQueue
from django_rmq_retry.registry import default_registry

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

ledger_events = Topic("orphans.ordered.ledger")


def _orphans() -> str:
    out = StringIO()
    call_command("rmq_orphans", stdout=out)
    return out.getvalue()


def _setup() -> None:
    call_command("rmq_setup", verbosity=0, stdout=StringIO())


def _partitions(queue: str, count: int) -> list[str]:
    return [Names.partition_queue(queue, k) for k in range(count)]


def _plain(message: Any, **kwargs: Any) -> None: ...


def test_partition_queues_are_owned_and_a_renamed_receiver_leaves_them_behind(
    rmq: Any, registry_snapshot: None
) -> None:
    @receiver(ledger_events, ordering_key="account")
    def ledger(message: Any, **kwargs: Any) -> None: ...

    queue = rmq.queue("ledger")
    _setup()
    remembered = set(DeclaredQueue.objects.filter(prefix=rmq.prefix).values_list("name", flat=True))
    assert set(_partitions(queue, 4)) <= remembered and queue not in remembered
    assert "No orphan queues." in _orphans()
    ledger_events.send({"account": "a-1"})  # waits in its partition; nothing consumes

    default_registry.unregister(ledger)

    @receiver(ledger_events, ordering_key="account")
    def ledger_renamed(message: Any, **kwargs: Any) -> None: ...

    _setup()
    listed = _orphans()
    assert "4 orphan queue(s)" in listed, listed
    for name in _partitions(queue, 4):
        assert name in listed
    assert f"{_partitions(queue, 4)[partition_of('a-1', 4)]}: 1 message(s)" in listed, listed


def test_a_receiver_made_ordered_leaves_its_plain_queue_behind(
    rmq: Any, registry_snapshot: None
) -> None:
    ledger_events.connect(_plain, queue="orphans_made_ordered")
    _setup()
    queue = rmq.queue("orphans_made_ordered")
    assert rmq.depth(queue) == 0
    assert "No orphan queues." in _orphans()

    default_registry.unregister(_plain)
    ledger_events.connect(_plain, queue="orphans_made_ordered", ordering_key="account")
    _setup()
    ledger_events.send({"account": "a-1"})  # still bound: it gets a copy nobody reads
    listed = _orphans()
    assert f"{queue}: 1 message(s)" in listed and "1 orphan queue(s)" in listed, listed


def test_fewer_partitions_leave_the_last_ones_behind(rmq: Any, registry_snapshot: None) -> None:
    ledger_events.connect(_plain, queue="orphans_fewer", ordering_key="account")
    _setup()
    queue = rmq.queue("orphans_fewer")
    assert "No orphan queues." in _orphans()
    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, "ORDERING_PARTITIONS": 2}):
        listed = _orphans()
    assert "2 orphan queue(s)" in listed, listed
    for name in _partitions(queue, 4)[2:]:
        assert name in listed
