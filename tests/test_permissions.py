"""Least privilege with real RabbitMQ users (docs/howto/permissions.md): ``rmq_setup`` as a
configure user declares; a write-only user publishes; a read+write user consumes. Users are
created with rabbitmqctl on the test broker for this test's prefix and deleted after."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from io import StringIO
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry.core.errors import PublishError, TopologyError
from django_rmq_retry.core.topology_plan import permissions
from django_rmq_retry.publishing.per_thread import reset_publisher
from tests.conftest import BROKER_URL, rabbitmqctl_cmd, read_log, start_consumer
from tests.testapp.events import other

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def _ctl(*args: str) -> None:
    subprocess.run(rabbitmqctl_cmd(*args), check=True, capture_output=True, timeout=60)


def _vhost() -> str:
    path = urlsplit(BROKER_URL).path.lstrip("/")
    return path.replace("%2F", "/") or "/"


@pytest.fixture
def users(rmq) -> Iterator[dict[str, str]]:
    """A user per kind of process, with the permissions core.topology_plan.permissions states."""
    if shutil.which(rabbitmqctl_cmd()[0]) is None:
        pytest.skip("rabbitmqctl is not available")
    made, urls = [], {}
    try:
        for p in permissions(rmq.prefix):
            kind = p.role.split()[0]
            name = f"{rmq.prefix}_{kind}_{uuid.uuid4().hex[:6]}"
            password = uuid.uuid4().hex
            _ctl("add_user", name, password)
            made.append(name)
            _ctl("set_permissions", "-p", _vhost(), name, p.configure, p.write, p.read)
            parts = urlsplit(BROKER_URL)
            urls[kind] = urlunsplit(
                parts._replace(netloc=f"{name}:{password}@{parts.hostname}:{parts.port or 5672}")
            )
        yield urls
    finally:
        for name in made:
            subprocess.run(rabbitmqctl_cmd("delete_user", name), capture_output=True, timeout=60)


def _as(url: str, **more: object):
    return override_settings(
        RMQ_RETRY={**settings.RMQ_RETRY, "BROKER_URL": url, "DECLARE_ON_SEND": False, **more}
    )


def test_a_write_only_user_sends_after_rmq_setup(rmq, users):
    out = StringIO()
    with _as(users["setup"], PREFIX=rmq.prefix):
        call_command("rmq_setup", stdout=out)
    assert re.search(r"Declared on .*: \d+ exchanges", out.getvalue())
    assert f"queue {rmq.queue('gamma')} ← test.other" in out.getvalue()
    with _as(users["publisher"], PREFIX=rmq.prefix):
        reset_publisher()
        other.send({"id": 1})
        reset_publisher()
    assert rmq.depth(rmq.queue("gamma")) == 1


@pytest.mark.undeclared  # the send itself would declare it all
def test_a_write_only_user_cannot_declare_on_send(rmq, users):
    """What DECLARE_ON_SEND=True (the behaviour before it existed) does to such a user."""
    with _as(users["publisher"], PREFIX=rmq.prefix, DECLARE_ON_SEND=True):
        reset_publisher()
        with pytest.raises((PublishError, TopologyError), match="no configure permission"):
            other.send({"id": 1})
        reset_publisher()


def test_a_read_write_user_consumes_what_rmq_setup_declared(rmq, users):
    with _as(users["setup"], PREFIX=rmq.prefix):
        call_command("rmq_setup", verbosity=0, stdout=StringIO())
    with _as(users["publisher"], PREFIX=rmq.prefix):
        reset_publisher()
        for i in range(3):
            other.send({"id": i, "fail": 1} if i == 0 else {"id": i})
        reset_publisher()
    proc = start_consumer(
        rmq.prefix,
        rmq.log,
        "gamma",
        "--max-messages",
        "4",
        "--max-idle-time",
        "10",
        RMQ_URL=users["consumer"],
        RMQ_DECLARE_ON_SEND="0",
    )
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    done = sorted(e["id"] for e in read_log(rmq.log) if e["event"] == "done")
    assert done == [0, 1, 2], out  # id 0 failed once: its retry went through the delay levels


@pytest.mark.undeclared  # its queue is missing
def test_a_consumer_without_configure_names_a_missing_queue(rmq, users):
    """Nothing declared: the read+write consumer cannot create its queue and says what to run."""
    proc = start_consumer(
        rmq.prefix,
        rmq.log,
        "gamma",
        "--fail-fast",
        "--max-idle-time",
        "5",
        RMQ_URL=users["consumer"],
    )
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert "rmq_setup" in out
