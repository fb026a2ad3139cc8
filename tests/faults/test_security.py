"""Security checks of the fault suite (the admin's are elsewhere): the broker password never
shows in output, logs or exceptions; bodies are never unpickled; TLS against a local cert."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry.errors import PublishError
from django_rmq_retry.publishing import Publisher
from tests.conftest import ROOT, read_log, subprocess_env, wait_for
from tests.faults.conftest import record, spawn, stop
from tests.faults.test_broker_faults import make_rows
from tests.testapp.events import work

SECRET = "S3cretPassw0rd-xyz"
URLS = {
    "closed port": f"amqp://fault-user:{SECRET}@127.0.0.1:1/%2F",
    "unknown host": f"amqp://fault-user:{SECRET}@no-such-host.invalid:5672/%2F",
    "wrong password": f"amqp://guest:{SECRET}@127.0.0.1:5672/%2F",
}


def manage(rmq, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(rmq.prefix, rmq.log, RMQ_URL=url)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


pytestmark = [pytest.mark.broker, pytest.mark.faults, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("where", sorted(URLS))
def test_password_never_printed_by_commands(rmq, where):
    url = URLS[where]
    make_rows(rmq, 1)  # so rmq_requeue really tries to publish
    outputs = []
    for args in (
        ["rmq_consume", "--fail-fast", "-v", "3"],
        ["rmq_consume", "--list"],
        ["rmq_consume", "--setup-only", "-v", "3"],
        ["rmq_requeue", "--no-progress", "-v", "3"],
    ):
        res = manage(rmq, url, *args)
        outputs.append((args, res.returncode, res.stdout + res.stderr))
    for args, _code, text in outputs:
        assert SECRET not in text, f"{args}: password printed:\n{text[-2000:]}"
    consume = outputs[0]
    assert consume[1] != 0
    assert "***" in consume[2], consume[2][-2000:]
    assert "***" in outputs[1][2], outputs[1][2]
    requeue = outputs[3]
    assert "***" in requeue[2] or "refused the login" in requeue[2], requeue[2][-2000:]


@pytest.mark.parametrize("where", sorted(URLS))
def test_password_never_in_exceptions_or_logs(rmq, where):
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        publisher = Publisher(URLS[where], declare=False)
        with pytest.raises(PublishError) as info:
            publisher.publish_raw("", "nowhere", b"{}", {"content_type": "application/json"})
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    logs = "\n".join(records)
    assert records, "pika and the library log the failed connection"
    text = "".join(traceback.format_exception(info.value))
    text += repr(info.value) + "".join(
        repr(e) for e in (info.value.__cause__, info.value.__context__) if e is not None
    )
    assert SECRET not in text, text
    assert SECRET not in logs, logs
    assert "***" in str(info.value)


def test_bodies_are_never_unpickled(rmq, tmp_path, procs):
    """A pickle whose loading would create a directory arrives as bytes, nothing runs."""
    marker = tmp_path / "pickle-ran"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    call_command("rmq_consume", setup_only=True, verbosity=0)
    work.send(pickle.dumps(Evil()), content_type="application/x-python-pickle")
    work.send(pickle.dumps(Evil()), content_type="application/python-pickle; charset=binary")
    proc = spawn(rmq, "alpha")
    procs.append(proc)
    assert wait_for(lambda: len([e for e in read_log(rmq.log) if e["event"] == "done"]) >= 2, 60)
    out = stop(proc)
    assert not marker.exists(), "a message body was unpickled"
    assert "Traceback" not in out, out


def _tls_listener() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5671), timeout=1).close()
        return True
    except OSError:
        return False


def test_amqps_against_a_local_certificate(rmq):
    if not _tls_listener():
        pytest.skip(
            "the shared RabbitMQ has no TLS listener on 5671; adding one means changing "
            "rabbitmq.conf and restarting the node every other session on this machine uses"
        )
    ca = os.environ.get("RMQ_TLS_CA_FILE")
    if not ca or not Path(ca).exists():
        pytest.skip("set RMQ_TLS_CA_FILE to the CA that signed the broker's certificate")
    conf = {"BROKER_URL": "amqps://guest:guest@localhost:5671/%2F", "TLS_CA_FILE": ca}
    from django.conf import settings

    with override_settings(RMQ_RETRY={**settings.RMQ_RETRY, **conf}):
        from django_rmq_retry import broker

        conn = broker.connect()
        assert conn.is_open
        conn.close()
    record("TLS amqps", published=0, handled=0, parked=0, duplicates=0, lost=0, notes="connected")
