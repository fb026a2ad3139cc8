"""The consumer's HTTP endpoint: ``/metrics`` (Prometheus), ``/healthz/live``, ``/healthz/ready``.

A small standard-library server on a daemon thread of the process that serves (the consumer,
or under ``--processes N`` the supervisor, which sums its children's multiprocess files).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

logger = logging.getLogger("django_rmq_retry.observability")


class Probe(Protocol):
    def live(self) -> bool: ...
    def ready(self) -> bool: ...


def serve(
    address: str, port: int, metrics: Callable[[], tuple[bytes, str]] | None, health: Probe
) -> ThreadingHTTPServer:
    """Start serving on ``(address, port)``; ``metrics`` gives the exposition and its
    content type (``None``: no ``/metrics``). Returns the server (``shutdown()`` stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/metrics" and metrics is not None:
                try:
                    body, content_type = metrics()
                except Exception:
                    logger.exception("collecting metrics failed")
                    self._answer(500, b"collecting metrics failed\n")
                    return
                self._answer(200, body, content_type)
            elif path == "/healthz/live":
                ok = health.live()
                self._answer(200 if ok else 503, b"live\n" if ok else b"stuck\n")
            elif path == "/healthz/ready":
                ok = health.ready()
                self._answer(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._answer(404, b"not found\n")

        def _answer(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape every few seconds is not worth a log line

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="rmq-metrics", daemon=True).start()
    return server
