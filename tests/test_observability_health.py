"""Health probes of a real consumer: liveness follows its I/O loop, readiness its consuming."""

from __future__ import annotations

import threading
import time

import pytest

from django_rmq_retry import hooks
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.registry import default_registry
from tests.conftest import wait_for
from tests.test_observability_metrics import free_port, get

pytest.importorskip("prometheus_client")

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def test_liveness_fails_while_the_io_loop_is_stuck_and_readiness_follows_consuming(rmq, tmp_path):
    from django_rmq_retry import observability

    # Live for 3 s after enable() without a loop tick: the first probe below counts on it
    # (a longer grace only makes the stuck loop below take longer to show).
    observer = observability.enable(
        metrics=True, tracing=False, liveness_timeout=3, health_dir=str(tmp_path)
    )
    port = free_port()
    server = observability.serve_consumer(observer, "127.0.0.1", port)
    consumer = Consumer([default_registry.find("gamma", rmq.prefix)], relay=False)
    runner = threading.Thread(target=consumer.run, daemon=True)
    stuck = threading.Event()
    try:
        # Started, not consuming yet: live (the grace to connect), not ready.
        assert get(port, "/healthz/live")[0] == 200
        assert get(port, "/healthz/ready")[0] == 503
        assert not (tmp_path / "ready").exists()
        runner.start()
        assert wait_for(lambda: get(port, "/healthz/ready")[0] == 200, timeout=120)
        assert (tmp_path / "ready").exists() and (tmp_path / "live").exists()

        # A callback on the connection's thread that does not return: the loop is stuck
        # (nothing settles, no heartbeat goes out) while the process is otherwise fine.
        connection = consumer._connection
        assert connection is not None
        connection.call_soon_threadsafe(stuck.wait)  # the link runs it on the I/O thread
        assert wait_for(lambda: get(port, "/healthz/live")[0] == 503, timeout=60)
        assert get(port, "/healthz/ready")[0] == 503
        touched = (tmp_path / "live").stat().st_mtime
        time.sleep(1.2)  # a window, not a wait: a turning loop touches the file each second
        assert (tmp_path / "live").stat().st_mtime == touched  # the exec probe's file too

        stuck.set()  # the loop turns again
        assert wait_for(lambda: get(port, "/healthz/live")[0] == 200, timeout=60)
        assert wait_for(lambda: get(port, "/healthz/ready")[0] == 200, timeout=60)
        assert wait_for(lambda: (tmp_path / "live").stat().st_mtime > touched, timeout=60)

        consumer.request_stop()
        runner.join(timeout=30)
        assert not runner.is_alive()
        assert get(port, "/healthz/ready")[0] == 503  # shut down: not ready
        assert not (tmp_path / "ready").exists()
    finally:
        stuck.set()
        consumer.request_stop()
        runner.join(timeout=30) if runner.is_alive() else None
        observer.stopped()
        observability.disable()
        server.shutdown()
        server.server_close()
    assert hooks.current is None
