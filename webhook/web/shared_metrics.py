"""Serving the metrics: ``/metrics`` on its own plain-HTTP port, and the metrics of
several worker processes served as one from the gunicorn master.

The port is apart from the HTTPS review port so Prometheus needs no client certificate and
the API server's port carries nothing but reviews; the scrape runs on its own daemon
thread and never waits behind a review.

It is bounded like the review port: at most :data:`MAX_CONNECTIONS` connections at once
(one thread each; more are closed unanswered), each read and write within
:data:`CONNECTION_TIMEOUT`, so idle or slow clients hold neither threads nor memory
without end. It binds to the address it is given (the chart can give the pod's IP
instead of every address) and, given a TLS context, serves HTTPS: the handshake runs on
the connection's thread, under the same timeout.

With ``workers > 1`` every worker counts into its own registry, but a scrape must see the
replica as a whole. prometheus-client's multiprocess mode does that: each process writes
its values to memory-mapped files in one directory, and a collector in the serving
process sums them up (gauges by their ``multiprocess_mode``, see
:mod:`webhook.base.metrics`). The master owns the directory and the ``/metrics``
endpoint; workers only write.

prometheus-client picks the mode once, when it is imported, from ``PROMETHEUS_MULTIPROC_DIR``,
so its documentation asks for the variable to be in the environment when the process
starts. :func:`enable` runs in the master, before the fork: when the variable is not set,
it starts the master again (the same program and arguments, the same process id) with the
variable naming a new empty directory, which the workers then inherit.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import ssl
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app, multiprocess
from prometheus_client.exposition import ThreadingWSGIServer

from webhook.base.metrics import DeprecatedAliases

#: prometheus-client reads the directory from this variable (in every process).
DIRECTORY_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Names the directory when :func:`enable` made it (and :func:`disable` removes it); a
#: directory given by the operator is left alone.
OWNED_ENV = "RPW_METRICS_DIR_OWNED"

#: Connections the metrics port serves at once: a Prometheus or two, and room to spare.
MAX_CONNECTIONS: Final = 16
#: Seconds any read or write of a metrics connection (its TLS handshake included) may take.
CONNECTION_TIMEOUT: Final = 10.0


def enable(parent: str | None = None) -> Path:
    """The directory every process of this server writes its metrics to: the one in
    ``PROMETHEUS_MULTIPROC_DIR``. Without it, this process starts again with the variable
    naming a new empty directory under ``parent`` (default: the system's temporary
    directory), and never returns."""
    given = os.environ.get(DIRECTORY_ENV)
    if given:
        return Path(given)
    directory = tempfile.mkdtemp(prefix="rpw-metrics-", dir=parent)
    env = {**os.environ, DIRECTORY_ENV: directory, OWNED_ENV: directory}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def registry(directory: Path) -> CollectorRegistry:
    """A registry that reads the sum of every process's values in ``directory``, renamed
    metrics under their former names too."""
    collected = CollectorRegistry()
    summed = multiprocess.MultiProcessCollector(collected, path=str(directory))  # type: ignore[no-untyped-call]
    collected.register(DeprecatedAliases(summed))
    return collected


def process_exited(pid: int, directory: Path) -> None:
    """Forget the ``live*`` gauges of an exited worker (its counters still count)."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


def disable(directory: Path) -> None:
    """Remove ``directory`` when :func:`enable` made it (the server is exiting)."""
    if os.environ.get(OWNED_ENV) == str(directory):
        shutil.rmtree(directory, ignore_errors=True)


__all__ = ["DIRECTORY_ENV", "OWNED_ENV", "disable", "enable", "process_exited", "registry"]


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


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class BoundedServer(ThreadingWSGIServer):
    """A thread per connection, at most ``max_connections`` of them, each socket with a
    ``timeout``; ``tls``: the context of each new connection (None: plain HTTP)."""

    max_connections = MAX_CONNECTIONS
    connection_timeout = CONNECTION_TIMEOUT
    tls: Callable[[], ssl.SSLContext] | None = None

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # Full: closed at once, nothing read; a scraper retries on its next interval.
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(self.connection_timeout)
            if self.tls is not None:
                try:
                    request = self.tls().wrap_socket(request, server_side=True)
                except (OSError, ValueError):
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def start_metrics_server(
    registry: CollectorRegistry,
    *,
    host: str = "0.0.0.0",
    port: int = 9090,
    tls: Callable[[], ssl.SSLContext] | None = None,
    max_connections: int = MAX_CONNECTIONS,
    timeout: float = CONNECTION_TIMEOUT,
) -> MetricsServer:
    """Serve ``registry`` in the Prometheus text format at ``http(s)://host:port/metrics``
    (the module docstring: its bounds; ``tls`` gives each connection's context).

    Port 0 picks a free port (see :attr:`MetricsServer.port`). Raises ``OSError`` when the
    address cannot be bound. Only this registry is served: the process-wide default
    registry is never touched, so several servers can run in one process (tests).
    """

    class Server(BoundedServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    Server.max_connections, Server.connection_timeout = max_connections, timeout
    httpd = make_server(host, port, make_wsgi_app(registry), Server, handler_class=_Quiet)
    httpd.tls = tls
    thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
    thread.start()
    server = MetricsServer(httpd, thread)
    scheme = "https" if tls is not None else "http"
    log.info("serving metrics on %s://%s:%d/metrics", scheme, server.host, server.port)
    return server
