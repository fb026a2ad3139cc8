"""pytest plugin: the ``rmq_broker`` fixture (an :class:`InMemoryBroker`, started and stopped
around the test). Enable it with ``pytest_plugins = ["django_rmq_retry.testing.pytest_plugin"]``.
Tests that park messages need database access, as usual: ``@pytest.mark.django_db``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .in_memory import InMemoryBroker


@pytest.fixture
def rmq_broker() -> Iterator[InMemoryBroker]:
    """A broker in memory for this test; ``Topic.send`` publishes into it."""
    with InMemoryBroker() as broker:
        yield broker
