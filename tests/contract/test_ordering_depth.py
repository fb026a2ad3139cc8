"""The contract for an ordered receiver's waiting messages: the in-memory broker routes each
key to the partition queue RabbitMQ routes it to, and its ``depth()`` of the receiver counts
every partition, as the partition queues on RabbitMQ add up."""

from __future__ import annotations

from typing import Any

import pytest

from django_rmq_retry import Topic, receiver
from django_rmq_retry.conf import ordering_partitions
from django_rmq_retry.core.topology_plan import receiver_queues
from django_rmq_retry.registry import Receiver, default_registry
from django_rmq_retry.testing import InMemoryBroker

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

depth_events = Topic("contract.ordered.depth")


@pytest.fixture
def ordered(registry_snapshot: None, rmq: Any) -> Receiver:
    @receiver(depth_events, ordering_key="key")
    def wait_in_partitions(message: Any, **kwargs: Any) -> None: ...

    rmq.setup()
    rec = default_registry.find("wait_in_partitions", rmq.prefix)
    assert rec is not None
    return rec


def test_an_ordered_receivers_depth_counts_its_partitions(ordered: Receiver, rmq: Any) -> None:
    bodies = [{"key": f"acct-{i % 5}", "n": i} for i in range(23)]
    queues = receiver_queues(ordered, rmq.prefix, ordering_partitions())
    depth_events.send_many(bodies)  # to RabbitMQ; nothing consumes
    real = {q: rmq.depth(q) for q in queues}
    with InMemoryBroker() as broker:
        depth_events.send_many(bodies)
        memory = {q: broker.depth(q) for q in queues}
        by_receiver = broker.depth(ordered.name)
        by_queue_name = broker.depth(ordered.queue_name(rmq.prefix))
        assert broker.delete_queue(ordered.name) == len(bodies)  # every partition
        assert broker.depth(ordered.name) == 0
    assert memory == real, f"in-memory partitions differ from RabbitMQ: {memory} != {real}"
    assert len([q for q, n in real.items() if n]) > 1  # the keys spread over partitions
    assert sum(real.values()) == by_receiver == by_queue_name == len(bodies)
