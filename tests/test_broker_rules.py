"""The broker rules (``core/broker_rules.py``): binding keys RabbitMQ 4.3.5 refuses, the
version floors, and the system check E050. Pure: no broker."""

from __future__ import annotations

import types

import pytest

from django_rmq_retry import checks
from django_rmq_retry.core.broker_rules import (
    hashes,
    parse_version,
    too_many_hashes,
    version_problems,
)
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.names import Names
from django_rmq_retry.core.topology_plan import plan
from django_rmq_retry.registry import default_registry


def test_hashes_count_whole_words_only():
    assert hashes("a.#.b.#") == 2
    assert hashes("a.#x.b") == 0
    assert too_many_hashes(["#", "a.#.b.#", "#.a.#.b.#", "*.*.*"]) == ["#.a.#.b.#"]


@pytest.mark.parametrize(
    ("version", "queue_type", "problem"),
    [
        ("3.9.29", "classic", "older than 3.10.0"),
        ("3.10.8", "classic", None),
        ("3.10.8", "quorum", None),
        ("4.0.5", "classic", None),
        ("4.0.5", "quorum", "upgrade to 4.2.7"),
        ("4.2.6", "quorum", "upgrade to 4.2.7"),
        ("4.2.7", "quorum", None),
        ("4.3.2", "quorum", "upgrade to 4.3.3"),
        ("4.3.6", "quorum", None),
        ("4.3.6-1", "classic", None),
        ("5.0.0", "quorum", None),
        ("banana", "classic", "cannot read"),
    ],
)
def test_version_floors(version, queue_type, problem):
    found = version_problems(version, queue_type)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found


def test_parse_version():
    assert parse_version("4.3.6") == (4, 3, 6)
    assert parse_version("4.3") == (4, 3, 0)
    assert parse_version("") is None


class Owner:
    name = "shop.invoice"
    routing_keys = ["shop.order.paid"]

    def queue_name(self, prefix: str) -> str:
        return f"{prefix}.{self.name}"


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_no_binding_key_we_declare_has_more_than_two_hashes(queue_type):
    the_plan = plan([Owner()], Names("p"), DelayLevels(100, 30), queue_type)
    keys = [b.routing_key for q in the_plan.queues for b in q.bindings]
    keys += [key for _d, _s, key in the_plan.exchange_bindings]
    assert keys and too_many_hashes(keys) == []


def test_a_receiver_key_with_three_hashes_fails_the_check(monkeypatch):
    bad = types.SimpleNamespace(name="shop.audit", routing_keys=["shop.#.order.#.paid.#"])
    monkeypatch.setattr(default_registry, "all", lambda: [bad])
    errors = checks._binding_keys()
    assert [e.id for e in errors] == ["django_rmq_retry.E050"]
    assert "shop.audit" in errors[0].msg and "4.3.5" in errors[0].msg


def test_registered_receivers_pass_the_check():
    assert checks._binding_keys() == []
