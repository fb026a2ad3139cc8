"""pytest plugin: the ``rmq_broker`` fixture (an :class:`InMemoryBroker`, started and stopped
around the test), and a guard against publishing to a real RabbitMQ by mistake.

Enable it with ``pytest_plugins = ["django_rmq_retry.testing.pytest_plugin"]`` in the
``conftest.py`` at the root of your tests. Tests that park messages need database access,
as usual: ``@pytest.mark.django_db``. See docs/howto/testing.md.

The guard: a test that does not use ``rmq_broker`` (nor an ``InMemoryBroker`` of its own)
and sends a message publishes it to the broker of your settings, a real one. That is
rarely what a test means, and nothing said so. Now the first such send of a test warns
(:class:`RealBrokerWarning`), or fails with ``rmq_real_broker = error`` in the pytest ini
options; ``rmq_real_broker = allow`` or ``@pytest.mark.rmq_real_broker`` on a test that
means it keeps quiet.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any, cast

import pytest

from .. import broker
from ..conf import broker_urls
from ..publishing.publisher import Publisher
from .in_memory import InMemoryBroker, _MemoryPublisher

MODES = ("warn", "error", "allow")


class RealBrokerWarning(UserWarning):
    """A test published to the real broker without the ``rmq_broker`` fixture."""


class RealBrokerError(AssertionError):
    """The same, with ``rmq_real_broker = error``."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "rmq_real_broker",
        "What a test that sends to the real RabbitMQ without the rmq_broker fixture gets: "
        "warn (default), error or allow.",
        default="warn",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rmq_real_broker: this test publishes to the real RabbitMQ on purpose"
    )


@pytest.fixture
def rmq_broker() -> Iterator[InMemoryBroker]:
    """A broker in memory for this test; ``Topic.send`` publishes into it."""
    with InMemoryBroker() as memory:
        yield memory


def _mode(config: pytest.Config) -> str:
    try:
        mode = str(config.getini("rmq_real_broker") or "warn").strip().lower()
    except ValueError:  # the plugin was loaded too late to register its ini option
        return "warn"
    if mode not in MODES:
        raise pytest.UsageError(f"rmq_real_broker must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _outside_us() -> int:
    """The ``stacklevel`` of the first caller outside this package: the warning points at
    the test's line that sent, not at ours."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # stacklevel 1 is guarded() (the function that warns), 2 its caller: sys._getframe(2)
    level, frame = 2, cast("FrameType | None", sys._getframe(2))
    while frame is not None and frame.f_code.co_filename.startswith(package):
        level, frame = level + 1, frame.f_back
    return level


@pytest.fixture(autouse=True)
def _rmq_real_broker_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Warn (or fail) at the first send of a test to the real broker; see the module."""
    mode = _mode(request.config)
    if (
        mode == "allow"
        or "rmq_broker" in request.fixturenames
        or request.node.get_closest_marker("rmq_real_broker") is not None
    ):
        yield
        return
    original = Publisher.send_bodies
    told: list[bool] = []
    test = request.node.nodeid

    def guarded(self: Publisher, *args: Any, **kwargs: Any) -> Any:
        if not told and not isinstance(self, _MemoryPublisher):
            told.append(True)
            where = ", ".join(broker.mask_url(u) for u in broker_urls())
            text = (
                f"{test} publishes to the real RabbitMQ at {where}, not to the in-memory "
                "broker: use the rmq_broker fixture (or `with InMemoryBroker():`), or mark the "
                "test @pytest.mark.rmq_real_broker if that is what it means."
            )
            if mode == "error":
                raise RealBrokerError(text)
            warnings.warn(text, RealBrokerWarning, stacklevel=_outside_us())
        return original(self, *args, **kwargs)

    Publisher.send_bodies = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        Publisher.send_bodies = original  # type: ignore[method-assign]
