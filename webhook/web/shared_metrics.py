"""Serving the metrics: ``/metrics`` on its own plain-HTTP port, and the metrics of
several worker processes served as one from the gunicorn master.

The port is apart from the HTTPS review port so Prometheus needs no client certificate and
the API server's port carries nothing but reviews; the scrape runs on its own daemon
thread and never waits behind a review.

With ``workers > 1`` every worker counts into its own registry, but a scrape must see the
replica as a whole. prometheus-client's multiprocess mode does that: each process writes
its values to memory-mapped files in one directory, and a collector in the serving
process sums them up (gauges by their ``multiprocess_mode``, see
:mod:`webhook.engine.metrics`). The master owns the directory and the ``/metrics``
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
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, multiprocess, start_http_server

#: prometheus-client reads the directory from this variable (in every process).
DIRECTORY_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Names the directory when :func:`enable` made it (and :func:`disable` removes it); a
#: directory given by the operator is left alone.
OWNED_ENV = "RPW_METRICS_DIR_OWNED"


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
    """A registry that reads the sum of every process's values in ``directory``."""
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected, path=str(directory))  # type: ignore[no-untyped-call]
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
