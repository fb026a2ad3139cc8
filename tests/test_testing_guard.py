"""The testing plugin as a user's project meets it: a test that forgets ``rmq_broker`` and
publishes to the real RabbitMQ is told (warn by default, fail with the strict ini option)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
from django.core.management import call_command

from tests.conftest import ROOT, subprocess_env

USER_TESTS = textwrap.dedent(
    """
    import pytest

    from tests.testapp.events import other


    def test_forgets_the_fixture():
        other.send({"id": 1})  # to the real broker of the settings


    def test_uses_the_fixture(rmq_broker):
        other.send({"id": 2})
        assert rmq_broker.sent_to(other) == [{"id": 2}]


    @pytest.mark.rmq_real_broker
    def test_means_it():
        other.send({"id": 3})
    """
)


def _pytest(tmp_path, env, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["django_rmq_retry.testing.pytest_plugin"]\n'
    )
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_django", "--ds", "tests.settings",
         "-p", "no:cacheprovider", "-q", "-rA", "--rootdir", str(tmp_path), str(tmp_path), *args],
        cwd=str(tmp_path),
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_test_publishing_to_the_real_broker_is_told(rmq, tmp_path):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    env = subprocess_env(rmq.prefix, rmq.log)
    warned = _pytest(tmp_path, env)
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert "3 passed, 1 warning" in warned.stdout, warned.stdout
    assert "RealBrokerWarning: test_user.py::test_forgets_the_fixture publishes to the real " in (
        warned.stdout
    )
    assert "use the rmq_broker fixture" in warned.stdout
    assert re.search(r"test_user\.py:\d+: RealBrokerWarning", warned.stdout)  # the test's line
    strict = _pytest(tmp_path, env, "-o", "rmq_real_broker=error")
    assert strict.returncode == 1, strict.stdout
    assert "1 failed, 2 passed" in strict.stdout, strict.stdout
    assert "FAILED test_user.py::test_forgets_the_fixture - " in strict.stdout
    # ids 1 and 3 of the first run (warned, and meant), id 3 of the second (the strict
    # run refused id 1 before publishing it)
    assert rmq.depth(rmq.queue("gamma")) == 3
