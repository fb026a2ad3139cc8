"""Shared fixtures: a real broker isolated per test by a unique prefix, and consumer runners.

Broker tests never skip: if RabbitMQ is unreachable the test fails and says how to start it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_rmq_retry.conf import current_plan
from django_rmq_retry.core.names import Names
from django_rmq_retry.publishing.per_thread import reset_publisher
from django_rmq_retry.registry import default_registry

#: Our own users' fixture (``rmq_broker``), tested as they would use it.
pytest_plugins = ["django_rmq_retry.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parent.parent
BROKER_URL = os.environ.get("RMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
#: The rabbitmqctl command for the broker of RMQ_URL: a prefix such as the one
#: ``scripts/brokers.sh rabbit4 env`` prints for the 4.0 node in its chroot.
RABBITMQCTL = shlex.split(os.environ.get("RMQ_CTL", "rabbitmqctl"))


def rabbitmqctl_cmd(*args: str) -> list[str]:
    """``rabbitmqctl ARGS`` aimed at the node the tests use (every test helper goes here)."""
    return [*RABBITMQCTL, *args]


#: The prefix of every ``rmq`` fixture of this session: what is left under them is swept.
_PREFIXES: set[str] = set()
_SWEPT: list[str] = []


class _Deleter:
    """Deletes each finished test's exchanges and queues on a thread of its own, so the next
    test does not wait for ~55 deletes (0.2-0.4 s on a loaded 2-core host, per test). Its
    connection lives on its thread only (pika's are not thread-safe) and is opened again
    after a broker restart; whatever it misses, the session's sweep deletes."""

    def __init__(self) -> None:
        self._todo: queue.Queue[tuple[list[str], list[str]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def delete(self, queues: list[str], exchanges: list[str]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rmq-cleanup", daemon=True)
            self._thread.start()
        self._todo.put((queues, exchanges))

    def finish(self, timeout: float = 120) -> None:
        if self._thread is not None:
            self._todo.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        conn: Any = None
        while (item := self._todo.get()) is not None:
            for method, names in (("queue_delete", item[0]), ("exchange_delete", item[1])):
                for name in names:
                    try:
                        if conn is None or not conn.is_open:
                            conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
                            ch = conn.channel()
                        elif not ch.is_open:
                            ch = conn.channel()
                        getattr(ch, method)(name)
                    except Exception:
                        conn = None  # the sweep deletes it
        if conn is not None and conn.is_open:
            with contextlib.suppress(Exception):
                conn.close()


_DELETER = _Deleter()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Delete the queues and exchanges this session's tests left on the broker.

    ``Rmq.cleanup`` deletes what the registry plans, but some objects escape it: queues of
    receivers a test registered (``registry_snapshot`` forgets them before ``rmq`` cleans
    up), queues and exchanges a test declares by hand, those of consumers in subprocesses.
    A developer's broker gathered dozens a run. AMQP cannot list, so ``rabbitmqctl`` does,
    once; only names under a prefix of this session are touched (another session on the
    same broker keeps its own).
    """
    _DELETER.finish()
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and os.environ.get("RMQ_TESTS_NONE_OK"):
        # scripts/test.sh with a -k or a path that leaves one of its parts nothing to run.
        session.exitstatus = pytest.ExitCode.OK
    if not _PREFIXES:
        return
    starts = tuple(f"{p}." for p in _PREFIXES)
    vhost = pika.URLParameters(BROKER_URL).virtual_host
    found: dict[str, list[str]] = {}
    for kind in ("queues", "exchanges"):
        try:
            out = subprocess.run(
                rabbitmqctl_cmd(f"list_{kind}", "-p", vhost, "-q", "--no-table-headers", "name"),
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _SWEPT.append(f"not swept: rabbitmqctl list_{kind} failed ({exc})")
            return
        if out.returncode:
            _SWEPT.append(f"not swept: rabbitmqctl list_{kind}: {out.stderr.strip()[:200]}")
            return
        found[kind] = [n for n in out.stdout.split() if n.startswith(starts)]
    if not any(found.values()):
        return
    try:
        conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    except Exception as exc:
        _SWEPT.append(f"not swept: {exc!r}")
        return
    with contextlib.closing(conn):
        ch = conn.channel()
        for name in found["queues"]:
            ch.queue_delete(name)
        for name in found["exchanges"]:
            ch.exchange_delete(name)
    _SWEPT.append(
        f"deleted {len(found['queues'])} queue(s) and {len(found['exchanges'])} exchange(s) "
        "the tests left on the broker"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _SWEPT:
        terminalreporter.write_line(f"broker sweep: {line}")


def _broker_reachable() -> str | None:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        conn.close()
        return None
    except Exception as exc:
        return repr(exc)


@pytest.fixture(scope="session")
def broker_ok() -> None:
    problem = _broker_reachable()
    if problem:
        pytest.fail(
            f"RabbitMQ is not reachable at {BROKER_URL} ({problem}). Start it with "
            "'rabbitmq-server -detached' (Debian package rabbitmq-server) or set RMQ_URL.",
            pytrace=False,
        )


#: Set by the rabbit43 leg of scripts/test.sh, whose broker (RMQ_URL) is RabbitMQ 4.3+.
RABBIT43 = bool(os.environ.get("RMQ_RABBIT43"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``rabbit43`` (4.3's behaviour, e.g. its quorum consumer timeout) run in
    the rabbit43 leg only: deselected elsewhere, as ``-m "not rabbit43"`` would (pytest
    counts them as deselected, never as passed)."""
    if RABBIT43:
        return
    kept = [item for item in items if item.get_closest_marker("rabbit43") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


@pytest.fixture
def registry_snapshot() -> Iterator[None]:
    """Restore the receiver registry after a test that registers receivers of its own."""
    saved = dict(default_registry._by_name)
    saved_topics = {k: list(v.topics) for k, v in saved.items()}
    yield
    default_registry._by_name.clear()
    default_registry._by_name.update(saved)
    for k, v in saved.items():
        v.topics[:] = saved_topics[k]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "undeclared: the rmq fixture leaves the test's prefix with nothing declared (a test "
        "of what a send or a consumer meets before rmq_setup ran)",
    )


def declare_for(request: pytest.FixtureRequest) -> None:
    """Declare the topology again if the test has a broker slice (``rmq``): a fixture that
    registers receivers calls it, so their queues exist before the test sends."""
    if "rmq" in request.fixturenames and not request.node.get_closest_marker("undeclared"):
        request.getfixturevalue("rmq").setup()


@pytest.fixture
def dbapp(registry_snapshot: None, request: pytest.FixtureRequest) -> Any:
    """``tests.faults.dbapp.consumers`` with its receivers registered in this process (and
    forgotten afterwards). The module is imported again each time: importing it registers
    them once, and an earlier test's ``registry_snapshot`` may have forgotten them since."""
    import importlib

    from tests.faults.dbapp import consumers

    for rec in default_registry.all():
        if rec.name.startswith(consumers.__name__ + "."):
            default_registry.unregister(rec.func)
    module = importlib.reload(consumers)
    declare_for(request)
    return module


@pytest.fixture
def effects(dbapp: Any) -> Any:
    """The ``faults.effects`` topic, whose idempotent receiver ``writes_effect`` writes an
    ``Effect`` row per message."""
    return dbapp.effects


class Rmq:
    """One test's private slice of the broker: every object it creates carries ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names = Names(prefix)
        self.conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        self.channel = self.conn.channel()

    def setup(self) -> None:
        """Declare this prefix's topology for every registered receiver, the way a deploy
        does (``rmq_consume --setup-only``): the suite runs the default
        ``DECLARE_ON_SEND=False``, so nothing is declared by a send. The ``rmq`` fixture
        calls it once; a test that registers receivers of its own calls it again."""
        call_command("rmq_consume", "--setup-only", stdout=io.StringIO())

    def ch(self) -> Any:
        if not self.conn.is_open:
            self.conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
        if not self.channel.is_open:
            self.channel = self.conn.channel()
        return self.channel

    def queue(self, receiver_short: str) -> str:
        rec = default_registry.find(receiver_short, self.prefix)
        assert rec is not None, receiver_short
        return rec.queue_name(self.prefix)

    def depth(self, queue: str) -> int:
        try:
            return self.ch().queue_declare(queue, passive=True).method.message_count
        except (pika.exceptions.StreamLostError, pika.exceptions.ConnectionClosed):
            # This connection did not live through a broker restart (fault tests): once more
            # on a new one.
            return self.ch().queue_declare(queue, passive=True).method.message_count

    def consumers(self, queue: str) -> int:
        """Consumers the broker counts on ``queue`` (a spare consumer is one more)."""
        return self.ch().queue_declare(queue, passive=True).method.consumer_count

    def get_all(self, queue: str) -> list[tuple[Any, Any, bytes]]:
        out = []
        while True:
            method, props, body = self.ch().basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append((method, props, body))

    def cleanup(self) -> None:
        """Hand this test's objects to the background deleter (nothing shares the prefix)."""
        plan = current_plan(default_registry.all(), self.names)
        _DELETER.delete([q.name for q in plan.queues], [name for name, _k, _a in plan.exchanges])
        with contextlib.suppress(Exception):
            self.conn.close()


@pytest.fixture
def rmq(
    broker_ok: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[Rmq]:
    """A unique prefix in settings, its topology declared (unless the test is marked
    ``undeclared``), a clean publisher, a per-test handling log, cleanup after."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    _PREFIXES.add(prefix)
    log = tmp_path / "handled.jsonl"
    monkeypatch.setenv("RMQ_TEST_LOG", str(log))
    conf = {**settings.RMQ_RETRY, "PREFIX": prefix, "BROKER_URL": BROKER_URL}
    with override_settings(RMQ_RETRY=conf):
        reset_publisher()
        helper = Rmq(prefix)
        helper.log = log  # type: ignore[attr-defined]
        try:
            if not request.node.get_closest_marker("undeclared"):
                helper.setup()
            yield helper
        finally:
            reset_publisher()
            helper.cleanup()


@pytest.fixture
def timed_pauses(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """Each pause ``publishing`` takes after a nack, really waited: ``(start, seconds)``
    with ``time.monotonic()`` starts. A test of a deadline uses :func:`virtual_pauses`
    instead: real pauses against a real deadline race the host's speed."""
    from django_rmq_retry.publishing import publisher

    pauses: list[tuple[float, float]] = []

    def pause(seconds: float) -> None:
        pauses.append((time.monotonic(), seconds))
        time.sleep(seconds)

    monkeypatch.setattr(publisher, "_pause", pause)
    return pauses


class VirtualClock:
    """The monotonic clock of the publisher's nack pauses (and a requeue's deadline),
    driven by the test: each pause moves it on instead of sleeping, and nothing else does.
    A deadline is then met or missed by the pauses alone, whatever the host's speed."""

    def __init__(self) -> None:
        self.now = 1_000.0
        #: Each pause taken: ``(start, seconds)`` on this clock.
        self.pauses: list[tuple[float, float]] = []

    def monotonic(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.pauses.append((self.now, seconds))
        self.now += seconds


@pytest.fixture
def virtual_pauses(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """A :class:`VirtualClock` for ``publishing.publisher`` and ``parking.requeuing``: give
    them a ``deadline`` on ``clock.now``, read the pauses from ``clock.pauses``."""
    from django_rmq_retry.parking import requeuing
    from django_rmq_retry.publishing import publisher

    clock = VirtualClock()
    time_of_its_own = types.SimpleNamespace(monotonic=clock.monotonic)
    monkeypatch.setattr(publisher, "time", time_of_its_own)
    monkeypatch.setattr(requeuing, "time", time_of_its_own)
    monkeypatch.setattr(publisher, "_pause", clock.pause)
    return clock


class ConfirmAll:
    """A publisher whose broker confirms everything at once (a requeue's database side):
    ``sent`` holds (exchange, routing key, body, properties) of each message, ``waits`` the
    times the requeue had nothing to publish yet."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes, Any]] = []
        self.waits = 0

    def stream_batches(self, batches, answered, window=0, most=None, deadline=None):
        for batch in batches:
            if batch is None:
                self.waits += 1
                continue
            for item in batch:
                self.sent.append((item.exchange, item.routing_key, item.body, item.properties))
                item.state = "ack"
            answered(batch)


def read_log(path: Path) -> list[dict[str, Any]]:
    """The events written so far: complete lines only (a consumer may be writing the last
    one while a test polls; a cluster scenario once read half a line and failed on it)."""
    if not path.exists():
        return []
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def subprocess_env(prefix: str, log: Path, **extra: str) -> dict[str, str]:
    """Environment for a ``manage.py`` child that shares this test's broker slice and database."""
    from django.db import connection

    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        RMQ_PREFIX=prefix,
        RMQ_URL=BROKER_URL,
        RMQ_TEST_LOG=str(log),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        env["DATABASE_URL"] = f"sqlite:///{s['NAME']}"
    else:
        env["DATABASE_URL"] = (
            f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
        )
    env.update(extra)
    return env


def _sigint_as_from_a_terminal() -> None:
    """In a child, before it runs: SIGINT's default action, as a command started from a
    terminal has it. A test run started in the background (``nohup``, ``cmd &`` in a script,
    as CI runners do) has SIGINT ignored, its children inherit that, and Python then never
    raises ``KeyboardInterrupt``: a test's Ctrl-C of ``rmq_requeue`` would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """A ``manage.py rmq_consume`` child whose output goes to a file, never to a pipe.

    A pipe nobody reads fills up at 64 KiB and blocks the child inside ``logging`` — which
    looks exactly like the hang a test is trying to catch. ``communicate`` mirrors Popen's.
    """

    def __init__(self, args: list[str], env: dict[str, str], out_path: Path) -> None:
        self.out_path = out_path
        self._out = open(out_path, "w")  # noqa: SIM115 - closed in communicate()
        self.popen = subprocess.Popen(
            args,
            cwd=str(ROOT),
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_sigint_as_from_a_terminal,
        )
        self.pid = self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout=timeout)

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def terminate(self) -> None:
        self.popen.terminate()

    def kill(self) -> None:
        self.popen.kill()

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        try:
            self.popen.wait(timeout=timeout)
        finally:
            self._out.close()
        return self.output(), None


def held_until(go: Path, code: str) -> str:
    """``manage.py shell -c`` code for children that start together: once Django is up it
    says so (a ``<go>.ready.<pid>`` file beside ``go``), waits for the file ``go``, then
    runs ``code``. :func:`all_ready` waits for them; no test sleeps for a start-up."""
    return (
        "import os, pathlib, time\n"
        f"go = pathlib.Path({str(go)!r})\n"
        "go.with_name(f'{go.name}.ready.{os.getpid()}').touch()\n"
        "while not go.exists(): time.sleep(0.01)\n"
        f"{code}"
    )


def all_ready(go: Path, count: int) -> None:
    """Until ``count`` children of :func:`held_until` said they are up (``tests.waiting``'s
    generous deadline: a loaded host can take many seconds to start Django)."""
    from tests import waiting

    waiting.until(
        f"{count} children up", lambda: len(list(go.parent.glob(f"{go.name}.ready.*"))) >= count
    )


def start_consumer(prefix: str, log: Path, *args: str, **env_extra: str) -> Child:
    out = log.with_name(f"consumer-{uuid.uuid4().hex[:8]}.out")
    return Child(
        [sys.executable, str(ROOT / "manage.py"), "rmq_consume", *args],
        subprocess_env(prefix, log, **env_extra),
        out,
    )


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
