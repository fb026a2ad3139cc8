"""``manage.py rmq_doctor`` against the real broker: nothing to report on a clean setup, and
each seeded problem found (three ``#``, a missing permission, drifted arguments, an orphan
queue). The version floors are pure (tests/test_broker_rules.py)."""

from __future__ import annotations

import types
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rmq_retry.management import doctor
from django_rmq_retry.registry import default_registry
from tests.test_permissions import _as, users  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

ALL_ROLES = ("--role", "setup", "--role", "send", "--role", "consume")


def _doctor(*args: str) -> tuple[str, bool]:
    """The report, and whether the command said all is well (exit status 0)."""
    out = StringIO()
    try:
        call_command("rmq_doctor", *args, stdout=out)
    except CommandError as exc:
        assert "problem(s) found" in str(exc)
        return out.getvalue(), False
    return out.getvalue(), True


def _problems(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("PROBLEM")]


def test_a_clean_setup_has_no_problem(rmq):
    report, well = _doctor(*ALL_ROLES)
    assert well, report
    assert _problems(report) == []
    assert "ok: RabbitMQ " in report and "No problem found." in report
    assert "exist with the arguments the code declares" in report


def test_a_missing_permission_is_named_with_its_fix(rmq, users):  # noqa: F811
    with _as(users["consumer"], PREFIX=rmq.prefix):
        report, well = _doctor("--role", "setup", "--role", "consume")
    assert not well
    [line] = _problems(report)
    assert "this user may not setup" in line and "ACCESS_REFUSED" in line
    assert f"set_permissions -p / <user> '^{rmq.prefix}\\.'" in line
    assert f"ok: this user may consume under '{rmq.prefix}'" in report
    with _as(users["publisher"], PREFIX=rmq.prefix):
        report, well = _doctor("--role", "send", "--role", "consume")
    assert not well
    [line] = _problems(report)
    assert "this user may not consume" in line and "ACCESS_REFUSED" in line
    assert f"ok: this user may send under '{rmq.prefix}'" in report


def test_drifted_arguments_are_found(rmq):
    queue = rmq.queue("gamma")
    ch = rmq.ch()
    ch.queue_delete(queue)
    ch.queue_declare(queue, durable=True, arguments={"x-max-length": 10})
    report, well = _doctor(*ALL_ROLES)
    assert not well
    [line] = _problems(report)
    # The broker names the first argument that differs (with quorum queues: the type).
    assert f"queue {queue!r} differs" in line and "inequivalent arg" in line, line
    assert "drain and delete it" in line


def test_a_binding_key_with_three_hashes_is_found(rmq, monkeypatch):
    bad = types.SimpleNamespace(
        name="shop.audit",
        routing_keys=["shop.#.order.#.paid.#"],
        ordering_key=None,
        queue_name=lambda prefix: f"{prefix}.shop.audit",
    )
    findings = doctor.examine([*default_registry.all(), bad], ["send"])
    problems = [f for f in findings if not f.ok]
    assert any("'shop.#.order.#.paid.#'" in f.what and "4.3.5" in f.what for f in problems)


def test_an_orphan_queue_is_found(rmq, registry_snapshot):
    from tests.testapp import consumers

    call_command("rmq_setup", stdout=StringIO())  # remembers the receiver queues it declared
    default_registry.unregister(consumers.beta)  # as if renamed: its queue is an orphan now
    report, well = _doctor("--role", "send")
    assert not well
    [line] = _problems(report)
    assert f"orphan queue {rmq.prefix}.tests.testapp.consumers.beta" in line, line
