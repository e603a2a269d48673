"""Several replicas of the webhook service behind one address, as a Deployment behind a
Service would be.

Each replica is its own ``python -m webhook serve`` process with its own cache, sharing
the Lease ledger and the leader Lease through the API server. A small TCP front spreads
connections round robin over the replicas whose port accepts a connection (a Service
drops endpoints that are not ready; a refused connect is the local equivalent), so
kube-apiserver reaches every replica through one registered URL. TLS passes through the
front untouched: every replica serves the same certificate.

Replicas can be killed (any signal) and started again on the same port, which is what the
restart-safety and failover tests need.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import selectors
import signal
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.kubeapi import KubeClient
from harness.launcher import free_port
from harness.processes import ManagedProcess
from harness.webhook_process import (
    NAMESPACE,
    SERVE_COMMAND,
    client_auth_files,
    client_context,
    ensure_namespace,
    launch,
    register,
    unregister,
    webhook_configuration,
    write_serving_files,
)

_CONNECT_TIMEOUT = 0.5
_BUFFER = 64 * 1024


class RoundRobinFront:
    """A TCP forwarder on 127.0.0.1: each accepted connection goes to the next backend
    port that accepts, both directions copied until either side closes."""

    def __init__(self, backends: Sequence[int], port: int | None = None) -> None:
        self.backends = list(backends)
        self.port = port or free_port()
        self.connections: dict[int, int] = {p: 0 for p in self.backends}
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="front", daemon=True)

    def start(self) -> RoundRobinFront:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(2)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        with self._lock:
            start = next(self._turn)
        for i in range(len(self.backends)):
            port = self.backends[(start + i) % len(self.backends)]
            try:
                upstream = socket.create_connection(("127.0.0.1", port), _CONNECT_TIMEOUT)
            except OSError:
                continue
            with self._lock:
                self.connections[port] += 1
            return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        with client, upstream, selectors.DefaultSelector() as sel:
            client.setblocking(False)
            upstream.setblocking(False)
            sel.register(client, selectors.EVENT_READ, upstream)
            sel.register(upstream, selectors.EVENT_READ, client)
            while not self._closed.is_set():
                for key, _ in sel.select(timeout=1.0):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    target: socket.socket = key.data
                    try:
                        data = source.recv(_BUFFER)
                        if not data:
                            return
                        target.setblocking(True)
                        target.sendall(data)
                        target.setblocking(False)
                    except OSError:
                        return


@dataclass
class Replica:
    """One service process; ``kill`` and ``start`` may be called any number of times."""

    index: int
    port: int
    metrics_port: int
    log_path: Path
    kubeconfig: Path
    cert_dir: Path
    ca_pem: bytes
    namespace: str
    extra_args: Sequence[str] = ()
    #: What runs the service (``harness.fault_hooks.COMMAND`` for fault injection).
    command: Sequence[str] = SERVE_COMMAND
    #: Whether the replica requires kube-apiserver's client certificate (``--client-ca``).
    client_auth: bool = True
    process: ManagedProcess | None = None

    @property
    def identity(self) -> str:
        return f"replica-{self.index}"

    def context(self) -> ssl.SSLContext:
        """A client context presenting kube-apiserver's certificate where the replica asks
        for it, as kube-apiserver calls the replica."""
        files = client_auth_files(self.kubeconfig) if self.client_auth else None
        return client_context(self.ca_pem, files)

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def start(self) -> None:
        """Start the process (again) on the same ports; waits for ``/readyz``."""
        if self.running():
            return
        self.process = launch(
            self.kubeconfig,
            self.cert_dir,
            self.log_path,
            port=self.port,
            metrics_port=self.metrics_port,
            ca_pem=self.ca_pem,
            namespace=self.namespace,
            command=self.command,
            extra_args=[*self.extra_args, "--identity", self.identity],
            name=self.identity,
            client_auth=self.client_auth,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group (SIGKILL: no cleanup at all) and reap."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        with contextlib.suppress(Exception):
            self.process.popen.wait(10)
        self.process.stop()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class ReplicaSet:
    """Running replicas, the front they share, and the registration pointing at it."""

    client: KubeClient
    front: RoundRobinFront
    ca_pem: bytes
    replicas: list[Replica] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.front.port}"

    def stop(self) -> None:
        """Unregister, then stop every replica and the front."""
        unregister(self.client)
        for replica in self.replicas:
            replica.stop()
        self.front.close()


def start_replicas(
    client: KubeClient,
    kubeconfig: Path,
    state_dir: Path,
    *,
    count: int = 2,
    namespace: str = NAMESPACE,
    extra_args: Sequence[str] = (),
    command: Sequence[str] = SERVE_COMMAND,
    register_webhook: bool = True,
    settle: float = 0.5,
    client_auth: bool = True,
) -> ReplicaSet:
    """Start ``count`` replicas (identities ``replica-0``...), the front, and register the
    front's URL as the ValidatingWebhookConfiguration (unless ``register_webhook`` is off).
    ``client_auth``: each replica requires kube-apiserver's client certificate (False:
    none, as on a managed control plane)."""
    cert_dir = state_dir / "replicas"
    ca_pem = write_serving_files(cert_dir)
    ensure_namespace(client, namespace)
    replicas: list[Replica] = []
    for index in range(count):
        replica = Replica(
            index=index,
            port=free_port(),
            metrics_port=free_port(),
            log_path=state_dir / "logs" / f"replica-{index}.log",
            kubeconfig=kubeconfig,
            cert_dir=cert_dir,
            ca_pem=ca_pem,
            namespace=namespace,
            extra_args=tuple(extra_args),
            command=tuple(command),
            client_auth=client_auth,
        )
        replicas.append(replica)
    front = RoundRobinFront([r.port for r in replicas]).start()
    replica_set = ReplicaSet(client, front, ca_pem, replicas)
    try:
        for replica in replicas:
            replica.start()
        if register_webhook:
            register(client, webhook_configuration(front.port, ca_pem, namespace))
            time.sleep(settle)
    except BaseException:
        replica_set.stop()
        raise
    return replica_set
