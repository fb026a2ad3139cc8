"""The example receivers, registered for each test and forgotten after it."""

import importlib
from types import ModuleType

import pytest

from django_rmq_retry.registry import default_registry
from tests.conftest import declare_for

# (rmq_broker comes from tests/conftest.py's pytest_plugins: pytest refuses them here.)


@pytest.fixture
def shop(registry_snapshot: None, request: pytest.FixtureRequest) -> ModuleType:
    from tests.docs_examples import shop

    for rec in default_registry.all():
        if rec.name.startswith(shop.__name__ + "."):
            default_registry.unregister(rec.func)
    module = importlib.reload(shop)
    declare_for(request)  # their queues exist before the example sends
    return module
