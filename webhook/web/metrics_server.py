"""``/metrics`` on its own plain-HTTP port.

Separate from the HTTPS review port so Prometheus needs no client certificate and the
API server's port carries nothing but reviews; the scrape runs on its own daemon thread
and never waits behind a review.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running metrics endpoint; :meth:`stop` it once (idempotent)."""

    httpd: WSGIServer
    thread: threading.Thread

    @property
    def host(self) -> str:
        return str(self.httpd.server_address[0])

    @property
    def port(self) -> int:
        """The bound port (the real one when started with port 0)."""
        return int(self.httpd.server_address[1])

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the socket; returns once the thread has ended."""
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(timeout)
        self.httpd.server_close()


def start_metrics_server(
    registry: CollectorRegistry, *, host: str = "0.0.0.0", port: int = 9090
) -> MetricsServer:
    """Serve ``registry`` in the Prometheus text format at ``http://host:port/metrics``.

    Port 0 picks a free port (see :attr:`MetricsServer.port`). Raises ``OSError`` when the
    address cannot be bound. Only this registry is served: the process-wide default
    registry is never touched, so several servers can run in one process (tests).
    """
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    server = MetricsServer(httpd, thread)
    log.info("serving metrics on http://%s:%d/metrics", server.host, server.port)
    return server
