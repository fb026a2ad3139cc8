"""Prometheus metrics and health probes of ``rmq_consume --metrics-port`` against the real
broker: scraped during a run, values checked against the messages counted."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import defaultdict

import pytest
from django.core.management import call_command

from tests.conftest import ROOT, read_log, start_consumer, subprocess_env, wait_for
from tests.testapp.events import other

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True), pytest.mark.slow]

HAPPY, FLAKY, REJECTED = 30, 5, 4  # flaky: fails twice then succeeds; rejected: parked at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def samples(port: int) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items (receiver shortened to its last part): value}."""
    status, text = get(port, "/metrics")
    assert status == 200, text
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {
                k: v.rsplit(".", 1)[-1] if k == "receiver" else v for k, v in s.labels.items()
            }
            out[s.name][tuple(sorted(labels.items()))] = s.value
    return out


def outcome(found: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in found.get(name, {}).items() if want <= set(k))


def send_mix() -> None:
    other.send_many([{"id": i} for i in range(HAPPY)])
    other.send_many([{"id": 100 + i, "fail": 2} for i in range(FLAKY)])
    other.send_many([{"id": 200 + i, "reject": True} for i in range(REJECTED)])


def settled_all(port: int) -> bool:
    found = samples(port) if get(port, "/healthz/live")[0] else {}
    total = outcome(found, "django_rmq_retry_messages_total", receiver="gamma")
    return total >= HAPPY + FLAKY * 3 + REJECTED


@pytest.mark.parametrize("processes", [1, 2])
def test_scraped_counts_match_the_messages(rmq, processes, tmp_path):
    call_command("rmq_consume", setup_only=True, verbosity=0)
    port = free_port()
    health = tmp_path / "health"
    proc = start_consumer(
        rmq.prefix,
        rmq.log,
        "gamma",
        "--metrics-port",
        str(port),
        "--processes",
        str(processes),
        "--health-dir",
        str(health),
    )
    try:
        assert wait_for(lambda: get(port, "/healthz/ready")[0] == 200, timeout=60), proc.output()
        assert get(port, "/healthz/live")[0] == 200
        # The exec probes' files (under a supervisor: written by it for all children).
        assert wait_for(lambda: (health / "ready").exists(), timeout=60)
        touched = (health / "live").stat().st_mtime_ns
        # Kept fresh: touched again while the loops turn (each second).
        assert wait_for(lambda: (health / "live").stat().st_mtime_ns > touched, timeout=60)
        send_mix()
        assert wait_for(lambda: settled_all(port), timeout=90), (samples(port), proc.output())
        found = samples(port)
        messages = "django_rmq_retry_messages_total"
        assert outcome(found, messages, receiver="gamma", outcome="acked") == HAPPY + FLAKY
        assert outcome(found, messages, receiver="gamma", outcome="retried") == 2 * FLAKY
        assert outcome(found, messages, receiver="gamma", outcome="parked") == REJECTED
        assert outcome(found, messages, outcome="released") == 0
        attempts = HAPPY + 3 * FLAKY + REJECTED
        assert (
            outcome(found, "django_rmq_retry_handle_duration_seconds_count", receiver="gamma")
            == attempts
        )
        # Every retry ran after its due time, and each was measured once.
        assert (
            outcome(found, "django_rmq_retry_retry_lateness_seconds_count", receiver="gamma")
            == 2 * FLAKY
        )
        assert outcome(found, "django_rmq_retry_park_batch_size_sum") == REJECTED
        assert outcome(found, "django_rmq_retry_in_flight", receiver="gamma") == 0
        # The parked backlog, from the kept group counts (read at most every 5 s).
        assert wait_for(
            lambda: (
                outcome(
                    samples(port),
                    "django_rmq_retry_parked_messages",
                    receiver="gamma",
                    status="parked",
                )
                == REJECTED
            ),
            timeout=15,
        )
        assert outcome(found, "django_rmq_retry_consumer_ready") == 1
        done = [e for e in read_log(rmq.log) if e["event"] == "done"]
        assert len(done) == HAPPY + FLAKY
        if processes == 2:
            pids = {e["pid"] for e in read_log(rmq.log)}
            assert proc.pid not in pids
        print(get(port, "/metrics")[1])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out


def test_nothing_is_imported_with_observability_off(rmq, tmp_path):
    """A bounded consumer run with every part off: neither extra is imported."""
    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send_many([{"id": i} for i in range(3)])
    script = (
        "import sys, django; django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('rmq_consume', 'gamma', max_messages=3, max_idle_time=20, verbosity=0)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('prometheus_client', "
        "'opentelemetry', 'django_rmq_retry.observability')))\n"
        "print('LOADED', loaded)\n"
    )
    env = subprocess_env(rmq.prefix, rmq.log)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout
    assert len([e for e in read_log(rmq.log) if e["event"] == "done"]) == 3
