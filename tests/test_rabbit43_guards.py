"""What RabbitMQ 4.2/4.3 refuse or answer differently, guarded without a broker: a declare
on a Khepri minority is retried (never a crash loop), and nothing we declare is a shape
4.3 denies by default (transient non-exclusive queues, global QoS)."""

from __future__ import annotations

import ast
from pathlib import Path

import pika.exceptions as pex
import pytest

from django_rmq_retry.broker import topology
from django_rmq_retry.core.errors import ConnectionLost, TopologyError
from django_rmq_retry.core.topology_plan import Plan

PACKAGE = Path(topology.__file__).resolve().parent.parent


class RefusingChannel:
    """A channel whose exchange declare the broker answers with ``code``."""

    def __init__(self, code: int, text: str) -> None:
        self.code, self.text = code, text

    def exchange_declare(self, *args, **kwargs):
        raise pex.ChannelClosedByBroker(self.code, self.text)


def _plan() -> Plan:
    return Plan(exchanges=[("p.work", "topic", {})], queues=[], exchange_bindings=[])


def test_a_declare_that_times_out_on_a_khepri_minority_is_a_lost_connection():
    # The consumer reconnects with its capped backoff on ConnectionLost; TopologyError
    # (a conflict an operator must fix) would stop it, and a supervisor would loop it.
    channel = RefusingChannel(541, "INTERNAL_ERROR - timed out waiting for the metadata store")
    with pytest.raises(ConnectionLost, match="minority side of a partition"):
        topology._declare(channel, _plan(), passive=False)


def test_a_conflict_still_stops_with_what_to_do():
    channel = RefusingChannel(406, "PRECONDITION_FAILED - inequivalent arg 'type'")
    with pytest.raises(TopologyError, match="already exists with different arguments"):
        topology._declare(channel, _plan(), passive=False)


def _calls(name: str) -> list[ast.Call]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == name
            ):
                found.append(node)
    return found


def _keyword(call: ast.Call, name: str) -> object:
    for kw in call.keywords:
        if kw.arg == name:
            return ast.literal_eval(kw.value) if isinstance(kw.value, ast.Constant) else ...
    return None


def test_every_queue_we_declare_is_durable_and_none_is_exclusive():
    declares = [c for c in _calls("queue_declare") if _keyword(c, "passive") is not True]
    assert declares, "the topology's queue_declare was not found"
    for call in declares:
        assert _keyword(call, "durable") is True, ast.unparse(call)
        assert _keyword(call, "exclusive") in (None, False), ast.unparse(call)
        assert _keyword(call, "auto_delete") in (None, False), ast.unparse(call)


def test_no_global_qos_anywhere():
    for call in _calls("basic_qos"):
        assert _keyword(call, "global_qos") in (None, False), ast.unparse(call)
