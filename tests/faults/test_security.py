"""Security checks of the fault suite (the admin's are elsewhere): the broker password never
shows in output, logs or exceptions; bodies are never unpickled; TLS against a local cert."""

from __future__ import annotations

import logging
import os
import pickle
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry.broker import Outgoing
from django_rmq_retry.core.errors import PublishError
from django_rmq_retry.publishing.publisher import Publisher
from tests.conftest import ROOT, read_log, subprocess_env, wait_for
from tests.faults.conftest import record, spawn, stop
from tests.faults.test_broker_faults import make_rows
from tests.testapp.events import work
from tests.waiting import consuming

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
            publisher.send_items(
                [Outgoing("", "nowhere", b"{}", {"content_type": "application/json"})]
            )
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
    consuming(rmq, rmq.queue("alpha"), child=proc)  # started: Django, then the broker
    assert wait_for(lambda: len([e for e in read_log(rmq.log) if e["event"] == "done"]) >= 2, 60)
    out = stop(proc)
    assert not marker.exists(), "a message body was unpickled"
    assert "Traceback" not in out, out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _make_ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.pem"),
        "-subj", f"/CN={name}",
        # Python 3.13 verifies strictly (VERIFY_X509_STRICT): a CA needs these extensions
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip


@pytest.fixture(scope="module")
def tls_broker() -> Iterator[tuple[int, Path]]:
    """A private RabbitMQ node with a TLS listener and a freshly generated CA.

    The machine's shared broker is left alone: this node has its own name, ports, data
    directory and (empty) plugin list, and is stopped after the module.
    """
    if not shutil.which("rabbitmq-server") or not shutil.which("openssl"):
        pytest.skip("rabbitmq-server and openssl are needed to start a private TLS node")
    try:
        owner = pwd.getpwnam("rabbitmq")
    except KeyError:
        pytest.skip("no 'rabbitmq' system user to run a private node")
    if os.geteuid() != 0:
        pytest.skip("starting a private RabbitMQ node needs root (the Debian wrapper su's)")
    d = Path(tempfile.mkdtemp(prefix="rmq-tls-"))
    _make_ca(d, "ca")
    _make_ca(d, "other-ca")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"),
    )  # fmt: skip
    (d / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(
        "x509", "-req", "-days", "2", "-in", str(d / "server.csr"),
        "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"), "-CAcreateserial",
        "-out", str(d / "server.pem"), "-extfile", str(d / "ext.cnf"),
    )  # fmt: skip
    tcp, ssl_port, dist = _free_port(), _free_port(), _free_port()
    (d / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = {tcp}\nlisteners.ssl.default = {ssl_port}\n"
        f"ssl_options.cacertfile = {d}/ca.pem\nssl_options.certfile = {d}/server.pem\n"
        f"ssl_options.keyfile = {d}/server.key\nssl_options.verify = verify_none\n"
        "ssl_options.fail_if_no_peer_cert = false\n"
    )
    (d / "enabled_plugins").write_text("[].\n")
    for path in [d, *d.iterdir()]:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    node = f"faultstls{os.getpid()}@localhost"
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
        "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
        "RABBITMQ_LOG_BASE": str(d / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_PID_FILE": str(d / "node.pid"),
    }
    subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, timeout=120)
    try:

        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", ssl_port), timeout=1).close()
                return True
            except OSError:
                return False

        if not wait_for(up, 90, 0.5):
            pytest.fail(f"private TLS node did not start; logs in {d / 'log'}")
        yield ssl_port, d
    finally:
        subprocess.run(["rabbitmqctl", "-n", node, "stop"], capture_output=True, timeout=120)
        shutil.rmtree(d, ignore_errors=True)


def test_amqps_against_a_local_certificate(rmq, tls_broker):
    """Publish and consume over amqps:// verified against a CA generated for this run; a
    broker certificate from another CA is refused (without printing the password)."""
    from django.conf import settings

    from django_rmq_retry import broker
    from django_rmq_retry.core.errors import BrokerUnavailable
    from django_rmq_retry.publishing.per_thread import reset_publisher

    port, d = tls_broker
    url = f"amqps://guest:guest@localhost:{port}/%2F"
    good = {**settings.RMQ_RETRY, "BROKER_URL": url, "TLS_CA_FILE": str(d / "ca.pem")}
    with override_settings(RMQ_RETRY=good):
        reset_publisher()
        try:
            call_command("rmq_consume", setup_only=True, verbosity=0)
            work.send({"id": "over-tls"})
            call_command("rmq_consume", "alpha", max_messages=1, max_idle_time=20, verbosity=0)
        finally:
            reset_publisher()
    done = [e["id"] for e in read_log(rmq.log) if e["event"] == "done"]
    assert done == ["over-tls"]
    bad = {**good, "TLS_CA_FILE": str(d / "other-ca.pem")}
    with override_settings(RMQ_RETRY=bad), pytest.raises(BrokerUnavailable) as info:
        broker.connect()
    assert "guest:guest" not in str(info.value)
    record(
        "TLS amqps (private node, local CA)",
        published=1,
        handled=len(done),
        parked=0,
        duplicates=0,
        lost=1 - len(done),
        notes=f"wrong CA refused: {str(info.value)[-70:]}",
    )
