"""Declaring an ordered receiver: ``Topic.connect`` takes ``ordering_key`` as
``@receiver`` does, and a consumer that could run two messages of one key at once is refused
before it starts."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_rmq_retry import Topic
from django_rmq_retry.conf import current_names
from django_rmq_retry.core.message import Message
from django_rmq_retry.core.ordering import OrderingKeyError, partition_of
from django_rmq_retry.core.topology_plan import receiver_queues
from django_rmq_retry.publishing.partitions import partitioner
from django_rmq_retry.registry import Registry


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
