"""The example receivers, registered for each test and forgotten after it."""

import importlib
from types import ModuleType

import pytest

from django_rmq_retry.registry import default_registry

# (rmq_broker comes from tests/conftest.py's pytest_plugins: pytest refuses them here.)


@pytest.fixture
def shop(registry_snapshot: None) -> ModuleType:
    from tests.docs_examples import shop

    for rec in default_registry.all():
        if rec.name.startswith(shop.__name__ + "."):
            default_registry.unregister(rec.func)
    return importlib.reload(shop)
