"""Test tools for projects that use django-rmq-retry: a broker in memory, on a virtual clock.

    from django_rmq_retry.testing import InMemoryBroker

    with InMemoryBroker() as broker:
        order_paid.send({"order_id": 42})
        broker.run_until_idle()          # retries run through the delay levels in virtual time
        assert broker.runs_of(send_invoice)[-1].outcome == "handled"

pytest users get the same as a fixture, ``rmq_broker``, with
``pytest_plugins = ["django_rmq_retry.testing.pytest_plugin"]`` in their ``conftest.py``.
The contract suite (``tests/contract``) runs the same scenarios against this broker and the
real RabbitMQ and demands identical outcomes.
"""

from .in_memory import InMemoryBroker, ReceiverRun, SentMessage

__all__ = ["InMemoryBroker", "ReceiverRun", "SentMessage"]
