"""Declaring an ordered receiver: ``Topic.connect`` takes ``ordering_key`` as
``@receiver`` does, and a consumer that could run two messages of one key at once is refused
before it starts."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_rmq_retry import Topic, receiver
from django_rmq_retry.conf import current_names
from django_rmq_retry.core.message import Message
from django_rmq_retry.core.ordering import OrderingKeyError, partition_of
from django_rmq_retry.core.topology_plan import receiver_queues
from django_rmq_retry.management import supervisor
from django_rmq_retry.publishing.partitions import partitioner
from django_rmq_retry.registry import Registry
from tests.conftest import read_log
from tests.testapp.events import other


def _message(body: Any) -> Message:
    return Message(body, b"", {}, "rk", "p.work", "", "", None, None, None, None, 1, False)


def test_connect_takes_an_ordering_key_as_the_decorator_does() -> None:
    reg = Registry()
    topic = Topic("declared.by.connect")

    def by_field(message: Any, **kwargs: Any) -> None: ...

    def by_call(message: Any, **kwargs: Any) -> None: ...

    assert topic.connect(by_field, ordering_key="account.id", registry=reg) is by_field
    topic.connect(by_call, ordering_key=lambda m: m.body["k"], queue="calls", registry=reg)
    call_rec, field_rec = reg.all()  # by dotted path
    assert field_rec.key_of(_message({"account": {"id": 7}})) == "7"
    assert call_rec.key_of(_message({"k": "x"})) == "x"
    assert receiver_queues(call_rec, "p", 3) == ["p.calls.p00", "p.calls.p01", "p.calls.p02"]
    with pytest.raises(ImproperlyConfigured, match="ordering_key="):
        Topic("declared.badly").connect(by_field, ordering_key="a..b", registry=Registry())


@pytest.mark.usefixtures("registry_snapshot")
def test_a_receiver_connected_with_a_key_gets_its_partition_header_at_send() -> None:
    """The publisher reads the default registry: a receiver connected there with a key is
    one it partitions for, and a body without the key is refused before it leaves."""
    topic = Topic("declared.by.connect.sent")

    def apply(message: Any, **kwargs: Any) -> None: ...

    topic.connect(apply, ordering_key="account_id", queue="connected_ordered")
    names = current_names()
    set_partitions = partitioner(topic.routing_key, names.work_exchange, names)
    assert set_partitions is not None
    props: dict[str, Any] = {"headers": {}, "content_type": "application/json"}
    set_partitions(b'{"account_id": "acct-3"}', props)
    header = names.partition_header(f"{names.prefix}.connected_ordered")
    assert props["headers"] == {header: str(partition_of("acct-3", 4))}
    with pytest.raises(OrderingKeyError, match="no field 'account_id'"):
        set_partitions(b'{"other": 1}', {"headers": {}, "content_type": "application/json"})


@pytest.fixture
def ordered(registry_snapshot: None) -> str:
    """An ordered receiver beside the test app's unordered ones; its dotted path."""

    @receiver(Topic("declared.threads"), ordering_key="k")
    def kept_in_order(message: Any, **kwargs: Any) -> None: ...

    return f"{__name__}.ordered.kept_in_order"


def _consume(*receivers: str, **options: Any) -> None:
    call_command("rmq_consume", *receivers, stdout=StringIO(), stderr=StringIO(), **options)


@pytest.mark.django_db
def test_rmq_consume_refuses_threads_that_could_overlap_a_key(
    ordered: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused with a CommandError that says what to do, before anything starts: with
    ``--processes`` no child is started (each would fail, and be restarted, for ever)."""

    def no_child(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a consumer process was started")

    monkeypatch.setattr(supervisor, "Supervisor", no_child)
    for processes in (1, 3):
        with pytest.raises(CommandError) as refused:
            _consume(threads=4, processes=processes, max_idle_time=0.1)
        said = str(refused.value)
        assert ordered in said and "--threads 4" in said and "--processes" in said
    with override_settings(RMQ_RETRY={"THREADS": 2}), pytest.raises(CommandError, match=ordered):
        _consume(max_idle_time=0.1)  # the setting, when --threads is not given


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_unordered_receivers_named_alone_still_run_with_threads(ordered: str, rmq: Any) -> None:
    other.send({"id": 1})
    _consume("gamma", threads=4, max_messages=1)
    assert [e["receiver"] for e in read_log(rmq.log) if e["event"] == "done"] == ["gamma"]
