"""A renamed receiver leaves its old queue behind, bound and filling: reported by
``rmq_orphans``, ``rmq_consume --list`` and at consumer start; deleted only on request."""

from __future__ import annotations

import logging
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_rmq_retry import receiver
from django_rmq_retry.models import DeclaredQueue
from django_rmq_retry.registry import default_registry
from tests.testapp import consumers
from tests.testapp.events import other

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def _run(*args: str, **opts) -> str:
    out = StringIO()
    call_command(*args, stdout=out, **opts)
    return out.getvalue()


def _rename_gamma() -> str:
    """What a project does by renaming ``gamma``: the old function is gone, a new one with
    another dotted path (so another queue) receives the same topic."""
    default_registry.unregister(consumers.gamma)

    @receiver(other)
    def gamma_renamed(message, **kwargs):
        return None

    return gamma_renamed.__module__


def test_a_renamed_receivers_old_queue_is_reported_and_deleted_on_request(
    rmq, registry_snapshot, caplog
):
    old_queue = rmq.queue("gamma")
    _run("rmq_setup", verbosity=0)
    assert DeclaredQueue.objects.filter(name=old_queue).exists()
    assert "No orphan queues." in _run("rmq_orphans")

    _rename_gamma()
    setup_out = _run("rmq_setup", verbosity=0)
    assert f"orphan queue {old_queue}" in setup_out
    other.send({"id": 1})  # the old queue is still bound: it gets a copy too
    assert rmq.depth(old_queue) == 1

    listed = _run("rmq_orphans")
    assert (
        f"{old_queue}: 1 message(s), 0 consumer(s); was the queue of tests.testapp.consumers.gamma"
        in listed
    )
    assert "1 orphan queue(s)" in listed
    assert old_queue in _run("rmq_consume", list=True)
    with caplog.at_level(logging.WARNING, logger="django_rmq_retry.management.orphans"):
        call_command("rmq_consume", max_idle_time=0.5, verbosity=0, stdout=StringIO())
    assert any(old_queue in r.getMessage() for r in caplog.records), caplog.text
    assert rmq.depth(old_queue) == 1  # reporting never deletes

    with pytest.raises(CommandError):
        _run("rmq_orphans", force=True)  # --force only with --delete
    kept = _run("rmq_orphans", delete=True)
    assert f"kept (not empty) {old_queue}" in kept
    assert rmq.depth(old_queue) == 1
    deleted = _run("rmq_orphans", delete=True, force=True)
    assert f"deleted {old_queue}" in deleted
    assert not DeclaredQueue.objects.filter(name=old_queue).exists()
    assert "No orphan queues." in _run("rmq_orphans")
    with pytest.raises(Exception, match="NOT_FOUND"):
        rmq.depth(old_queue)


def test_a_remembered_queue_the_broker_lost_is_forgotten(rmq, registry_snapshot):
    _run("rmq_setup", verbosity=0)
    old_queue = rmq.queue("gamma")
    _rename_gamma()
    rmq.ch().queue_delete(old_queue)
    assert "No orphan queues." in _run("rmq_orphans")
    assert not DeclaredQueue.objects.filter(name=old_queue).exists()


def test_a_queue_declared_by_setup_only_is_an_orphan_once_its_receiver_is_renamed(
    rmq, registry_snapshot
):
    """A deploy that declares with ``rmq_consume --setup-only`` (not ``rmq_setup``) and
    renames a receiver later: ``--list`` names the queue left behind."""
    old_queue = rmq.queue("gamma")
    DeclaredQueue.objects.all().delete()  # what the rmq fixture's own declare remembered
    _run("rmq_consume", setup_only=True, verbosity=0)
    assert DeclaredQueue.objects.get(name=old_queue).receiver == "tests.testapp.consumers.gamma"

    _rename_gamma()
    listed = _run("rmq_consume", list=True)
    assert "Orphan queues (no receiver owns them; rmq_orphans)" in listed
    assert (
        f"  {old_queue}: 0 message(s), 0 consumer(s); was the queue of "
        "tests.testapp.consumers.gamma" in listed
    ), listed
