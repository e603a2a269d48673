"""Running the webhook under gunicorn, configured in code (no config file, no CLI parsing).

Process model: one gunicorn master and ``workers`` worker processes, each serving every
connection as a greenlet (gevent, :mod:`webhook.web.worker`). Why:

* a connection costs a greenlet, not a thread: idle, slow or hostile clients wait on
  their sockets without taking what the API server's reviews need, and the app runs
  only once a request is whole (the deadlines are :class:`ServerOptions`'s);
* the review path is CPU under the GIL: threads add no throughput, only hand-offs, and
  one event loop per process serves as many;
* one worker process by default, ``--workers 2`` for a 2-core replica (docs/service.md
  has the figures). Each process keeps its own cluster cache - one list and one watch
  per kind against the API server, and the memory of every pod - and they share the
  ledger (the API server), elect the preemption worker's leader among themselves like
  replicas do (each under ``identity-<pid>``), and count metrics into one view that the
  gunicorn master serves (:mod:`webhook.web.shared_metrics`).

The app is built **inside the worker process** (gunicorn calls
:meth:`WebhookServer.load` after the fork): the cache's watches and the preemption
worker must start in the process that serves, and only there is the standard library
cooperative (patched by gevent), which every socket the app opens must be.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

from gunicorn.app.base import BaseApplication
from prometheus_client import CollectorRegistry

from webhook.base.settings import DEFAULT_CLIENT_CN, Config
from webhook.tls.serving import DEFAULT_CHECK_INTERVAL, CertificateReloader
from webhook.web import shared_metrics
from webhook.web.shared_metrics import MetricsServer, start_metrics_server
from webhook.web.worker import WORKER_CLASS, HandshakeDeadline

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

log = logging.getLogger(__name__)

#: Worker processes of a replica: see the module docstring.
DEFAULT_WORKERS: Final = 1
#: Connections one worker holds at once (gunicorn's default). Past it, new connections
#: wait in the listen backlog: the one limit of the serving model that is a count, not
#: a deadline. Each costs a greenlet and a TLS buffer, some tens of kB.
DEFAULT_WORKER_CONNECTIONS: Final = 1000
#: Memory of one worker process besides what its connections' bodies take: the
#: interpreter and libraries, the cluster cache of a cluster of a few thousand pods, and
#: the one review it decides at a time (its parsed JSON, several times the body).
#: docs/reliability.md, "Memory under a flood of bodies", has the measurement.
WORKER_BASELINE_BYTES: Final = 192 * 1024 * 1024
#: Bytes a connection holds per byte of its body while reading it: gunicorn's read
#: buffer, and the copy handed to the app.
BODY_COPIES: Final = 2


def memory_needed(workers: int, worker_connections: int, max_body_bytes: int) -> int:
    """The most the review port's connections can make the replica hold: every worker
    at its baseline, every connection with a whole body of the largest size."""
    return workers * (WORKER_BASELINE_BYTES + worker_connections * BODY_COPIES * max_body_bytes)


def connections_within(memory_limit: int, workers: int, max_body_bytes: int) -> int:
    """The most connections per worker whose bodies fit ``memory_limit`` (0: none)."""
    per_worker = memory_limit // workers - WORKER_BASELINE_BYTES
    return max(0, per_worker // (BODY_COPIES * max_body_bytes))


#: The API server completes a handshake on loopback or a cluster network in
#: milliseconds and sends its request at once; 10 s leave room for a loaded node.
DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
DEFAULT_HEADER_TIMEOUT: Final = 10.0
#: A review body is at most a few MB; the API server sends it in one go.
DEFAULT_BODY_TIMEOUT: Final = 10.0
#: The app's own limit unless the service passes its configured one.
DEFAULT_MAX_BODY_BYTES: Final = Config().max_body_bytes
#: The API server's webhook client keeps idle connections for Go's default 90 s
#: (k8s.io/apimachinery util/net ``SetOldTransportDefaults``). Holding ours longer means
#: the client, not us, closes an idle connection, so it never sends a review down a
#: connection we are closing; and reviews rarely pay for a new TLS handshake.
DEFAULT_KEEPALIVE: Final = 120
#: Seconds a stopping worker lets in-flight reviews finish (well under the pod's
#: terminationGracePeriodSeconds, 30 s by default).
DEFAULT_GRACEFUL_TIMEOUT: Final = 15

#: Seconds a worker of several waits for its cache before accepting connections anyway
#: (a first sync of a large cluster takes under a minute), and how often it looks.
SETTLE_TIMEOUT: Final = 300.0
SETTLE_POLL: Final = 0.1

#: Logged at start while anyone who reaches the review port may post a review.
UNAUTHENTICATED_WARNING: Final = (
    "reviews are accepted from unauthenticated callers (no --client-ca): anyone who "
    "reaches the review port can post one; give the CA of kube-apiserver's client "
    "certificate, or turn on the NetworkPolicy (docs/deploy.md)"
)

#: Stops what a :data:`StartServices` started; called once, in the worker, at exit.
StopServices = Callable[[], None]
#: Starts background services (cache watches, preemption worker, leader election) in
#: the worker process once the app is loaded; returns how to stop them.
StartServices = Callable[[], StopServices]


@dataclass(frozen=True, slots=True)
class WorkerApp:
    """What an :class:`AppFactory` builds in each worker process.

    ``app``: the WSGI app (normally :func:`webhook.web.app.create_app`'s Flask app).
    ``start``: background services, started after the app loaded, stopped at exit.
    ``registry``: served on the metrics port by this worker (the registry lives in the
    worker, where the metrics are counted).
    """

    app: WSGIApplication
    start: StartServices | None = None
    registry: CollectorRegistry | None = None
    #: Whether the app can decide yet (the cluster cache synced). With several workers,
    #: a worker waits for it before accepting connections: :meth:`WebhookServer._settle`.
    ready: Callable[[], bool] | None = None
    #: Called for each new connection the overloaded worker resets before its handshake
    #: (:mod:`webhook.web.worker`): no request of it ever reaches ``app`` to be counted.
    refused: Callable[[], None] | None = None


#: Builds the app in the worker process. Its argument is the serving certificate, whose
#: :meth:`~CertificateReloader.loaded` belongs in the readiness checks.
AppFactory = Callable[[CertificateReloader], WorkerApp]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How to serve; every field has the production default except the TLS files."""

    cert_file: str
    key_file: str
    host: str = "0.0.0.0"
    port: int = 8443
    workers: int = DEFAULT_WORKERS
    worker_connections: int = DEFAULT_WORKER_CONNECTIONS
    #: Seconds (gunicorn takes whole seconds).
    keepalive: int = DEFAULT_KEEPALIVE
    graceful_timeout: int = DEFAULT_GRACEFUL_TIMEOUT
    #: None: no metrics server. Port 0 picks a free one (tests).
    metrics_port: int | None = 9090
    metrics_host: str = "0.0.0.0"
    #: Serve the metrics over HTTPS, with the serving certificate (no client certificate).
    metrics_tls: bool = False
    tls_check_interval: float = DEFAULT_CHECK_INTERVAL
    log_level: str = "info"
    #: Deadlines of a connection before the app sees its request (seconds; see
    #: :mod:`webhook.web.worker`), and the largest body read.
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: A file of CA certificates: review connections must present a client certificate
    #: one of them signed (kube-apiserver's, docs/deploy.md). None: anyone may connect.
    client_ca: str | None = None
    #: With ``client_ca``: the Common Name the client certificate must bear.
    client_cn: str = DEFAULT_CLIENT_CN
    #: A second port, on ``host``, serving only ``/livez`` and ``/readyz`` without a client
    #: certificate (the kubelet's probes present none); None: no such port.
    probe_port: int | None = None
    #: Bytes the replica may use; None: not checked (see :func:`memory_needed`).
    memory_limit: int | None = None

    def validate(self) -> None:
        """Raises ``ValueError`` on a combination that cannot work."""
        if self.workers < 1 or self.worker_connections < 1:
            raise ValueError("workers and worker_connections must be at least 1")
        if min(self.handshake_timeout, self.header_timeout, self.body_timeout) <= 0:
            raise ValueError("handshake, header and body timeouts must be positive")
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        if self.probe_port is not None and self.probe_port == self.port:
            raise ValueError("the probe port must differ from the review port")
        if self.memory_limit is not None:
            needed = memory_needed(self.workers, self.worker_connections, self.max_body_bytes)
            if needed > self.memory_limit:
                fits = connections_within(self.memory_limit, self.workers, self.max_body_bytes)
                raise ValueError(
                    f"{self.workers} workers x {self.worker_connections} connections x "
                    f"{self.max_body_bytes}-byte bodies need {needed} bytes, more than the "
                    f"memory limit of {self.memory_limit}: at most {fits} connections per "
                    "worker fit (lower --worker-connections, max-body-bytes or --workers)"
                )

    @property
    def shared_metrics(self) -> bool:
        """Metrics summed over several workers and served by the master."""
        return self.workers > 1 and self.metrics_port is not None


def _worker_tmp_dir() -> str | None:
    # gunicorn's worker heartbeat file; the container's root filesystem is read-only,
    # /dev/shm is writable memory there (and keeps the heartbeat off a slow disk).
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class WebhookServer(BaseApplication):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn, configured from :class:`ServerOptions`, serving what ``app_factory``
    builds in the worker. State set in the worker (services, metrics server) lives in
    that process's copy of this object."""

    def __init__(
        self, app_factory: AppFactory, options: ServerOptions, tls: CertificateReloader
    ) -> None:
        options.validate()
        self.options = options
        self.tls = tls
        self._factory = app_factory
        self._worker_app: WorkerApp | None = None
        self._stops: list[Callable[[], None]] = []
        #: With shared metrics: their directory and the master's endpoint.
        self._metrics_dir: Path | None = None
        self._master_metrics: MetricsServer | None = None
        super().__init__()

    def settings(self) -> dict[str, Any]:
        """The gunicorn settings, by name (also what tests inspect)."""
        o = self.options
        tls = self.tls
        ports = [o.port] if o.probe_port is None else [o.port, o.probe_port]
        return {
            "bind": [f"[{o.host}]:{p}" if ":" in o.host else f"{o.host}:{p}" for p in ports],
            # Greenlets with deadlines: see webhook.web.worker.
            "worker_class": WORKER_CLASS,
            "workers": o.workers,
            "worker_connections": o.worker_connections,
            "keepalive": o.keepalive,
            "timeout": 30,
            "graceful_timeout": o.graceful_timeout,
            # Never load in the master: see the module docstring.
            "preload_app": False,
            # gunicorn needs the file names to switch TLS on (and checks they exist).
            # The worker's server wraps every accepted socket through this object: the
            # reloader's newest context, a deadline on the handshake.
            "certfile": o.cert_file,
            "keyfile": o.key_file,
            "ssl_context": lambda _conf, _default: HandshakeDeadline(
                tls, o.handshake_timeout, o.probe_port
            ),
            # The API server sends a short request line and a handful of headers; the
            # body limit is the app's (Config.max_body_bytes).
            "limit_request_line": 2048,
            "limit_request_fields": 32,
            "limit_request_field_size": 8190,
            "worker_tmp_dir": _worker_tmp_dir(),
            # No control socket: it would be a file in $HOME (read-only in the container)
            # and nobody manages this server by hand.
            "control_socket_disable": True,
            # One JSON decision-log line per review replaces the access log.
            "accesslog": None,
            "errorlog": "-",
            "loglevel": o.log_level,
            "proc_name": "resize-preemption-webhook",
            "post_worker_init": self._post_worker_init,
            "worker_exit": self._worker_exit,
            "when_ready": self._when_ready,
            "child_exit": self._child_exit,
            "on_exit": self._on_exit,
        }

    # -- gunicorn's BaseApplication ---------------------------------------------------

    def load_config(self) -> None:
        for name, value in self.settings().items():
            if value is not None:
                self.cfg.set(name, value)
        if self.options.shared_metrics and self._metrics_dir is None:
            # In the master, before any worker is forked (see shared_metrics).
            self._metrics_dir = shared_metrics.enable(_worker_tmp_dir())

    def load(self) -> WSGIApplication:
        """Called in the worker process, after the fork."""
        self._worker_app = self._factory(self.tls)
        return self._worker_app.app

    def connection_refused(self) -> None:
        """The worker reset a new connection unserved (overloaded): tell the app."""
        served = self._worker_app
        if served is not None and served.refused is not None:
            served.refused()

    # -- hooks (run in the worker) ----------------------------------------------------

    def _post_worker_init(self, worker: Any) -> None:
        if self._master_metrics is not None:
            # The master's listening socket, inherited by the fork: only the master serves.
            self._master_metrics.httpd.server_close()
        served = self._worker_app
        if served is None:
            return
        if served.start is not None:
            self._stops.append(served.start())
        if served.ready is not None and self.options.workers > 1:
            self._settle(worker, served.ready)
        if (
            served.registry is not None
            and self.options.metrics_port is not None
            and not self.options.shared_metrics
        ):
            metrics: MetricsServer = start_metrics_server(
                served.registry,
                host=self.options.metrics_host,
                port=self.options.metrics_port,
                tls=self._metrics_tls(),
            )
            self._stops.append(metrics.stop)

    @staticmethod
    def _settle(worker: Any, ready: Callable[[], bool]) -> None:
        """Wait (up to :data:`SETTLE_TIMEOUT`) until this worker can decide, before it
        accepts a connection. With one worker, ``/readyz`` keeps the Service from sending
        reviews too early; with several, any worker may answer the probe for the replica,
        so one still syncing its cache must not take connections meanwhile. Past the
        timeout it serves anyway: reviews it cannot plan are allowed (fail open)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while not ready() and time.monotonic() < deadline:
            worker.notify()  # a long first sync is not a hung worker: keep the heartbeat
            time.sleep(SETTLE_POLL)

    def _worker_exit(self, server: Any, worker: Any) -> None:
        # Also called in the master for a worker that vanished: nothing started there.
        while self._stops:
            stop = self._stops.pop()
            try:
                stop()
            except Exception:
                log.exception("error stopping a background service")

    # -- hooks (run in the master) ----------------------------------------------------

    def _when_ready(self, server: Any) -> None:
        if self._metrics_dir is None or self.options.metrics_port is None:
            return
        self._master_metrics = start_metrics_server(
            shared_metrics.registry(self._metrics_dir),
            host=self.options.metrics_host,
            port=self.options.metrics_port,
            tls=self._metrics_tls(),
        )

    def _metrics_tls(self) -> Callable[[], ssl.SSLContext] | None:
        # The serving pair as it rotates; a scraper presents no client certificate.
        tls = self.tls
        return (lambda: tls.context(probes=True)) if self.options.metrics_tls else None

    def _child_exit(self, server: Any, worker: Any) -> None:
        if self._metrics_dir is not None:
            shared_metrics.process_exited(worker.pid, self._metrics_dir)

    def _on_exit(self, server: Any) -> None:
        if self._master_metrics is not None:
            self._master_metrics.stop()
        if self._metrics_dir is not None:
            shared_metrics.disable(self._metrics_dir)


def check_address(host: str) -> None:
    """Raises ``ValueError`` (one line) unless this machine can listen on ``host``: it
    resolves, and a socket binds there (on a port the system picks, closed at once), so
    that gunicorn's own bind of the serving port does not retry and fail later."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ValueError(f"--host {host!r} does not resolve: {getattr(e, 'strerror', e)}") from None
    family, _, _, _, address = found[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address[0], 0, *address[2:]))
    except OSError as e:
        raise ValueError(
            f"--host {host!r} is not an address of this machine: {e.strerror}"
        ) from None


def serve(app_factory: AppFactory, options: ServerOptions) -> NoReturn:
    """Serve HTTPS as ``options`` say until SIGTERM/SIGINT; exits the process (gunicorn's
    master calls ``sys.exit``).

    Raises :class:`~webhook.tls.serving.TLSConfigError` before forking when the certificate
    and key cannot be served, ``ValueError`` on bad options.
    """
    options.validate()
    tls = CertificateReloader(
        options.cert_file,
        options.key_file,
        check_interval=options.tls_check_interval,
        client_ca=options.client_ca,
        client_cn=options.client_cn,
    )
    if not tls.authenticates:
        log.warning(UNAUTHENTICATED_WARNING)
    WebhookServer(app_factory, options, tls).run()
    raise SystemExit(0)  # run() exits itself; this keeps the NoReturn contract explicit
