"""Starts a local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

* etcd runs with ``--unsafe-no-fsync`` on a data dir in the state directory;
* kube-apiserver serves on 127.0.0.1 with RBAC, an admin client certificate
  (O=system:masters) made with :mod:`webhook.tls.pki`, service-account signing keys, configurable
  feature gates, ``PodResizeValidator`` enabled when the version has it and the
  ``ServiceAccount`` admission plugin disabled (no token controller runs, so it would reject
  every pod for lack of a ``default`` service account);
* kube-controller-manager runs ONLY the disruption controller (PDB status), plus the
  deployment and replicaset controllers when asked (workloads for the VPA updater, see
  :mod:`harness.vpa`): the default set includes node-lifecycle, which would evict pods
  whenever a node misses a heartbeat;
* kube-scheduler runs without leader election.

Every port is picked free; every process is stopped by :meth:`ControlPlane.stop`, by the
context manager, at interpreter exit and on SIGTERM (see :mod:`harness.processes`).
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import socket
import ssl
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import pki as harness_pki
from harness.binaries import Binaries
from harness.crds import PROJECT_CRDS, install_crds
from harness.kubeapi import Credentials, KubeClient
from harness.processes import ManagedProcess, spawn
from webhook.base.settings import DEFAULT_CLIENT_CN
from webhook.tls import pki

SERVICE_CIDR = "10.0.0.0/24"
#: What a Deployment needs to get pods: its ReplicaSets, and their pods. No garbage
#: collector: nothing here relies on cascading deletion (whoever removes a Deployment
#: removes its ReplicaSets and pods too), and its graph watches every resource type.
# The garbage collector with them, as in every real cluster: removing a Deployment (helm
# uninstall, a test's cleanup) removes its ReplicaSets and their pods, which the replicaset
# controller would otherwise keep recreating.
WORKLOAD_CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
)
#: What pods on a real node need from kube-controller-manager: a ``default`` service account
#: in every namespace and the ``kube-root-ca.crt`` ConfigMap (their API credentials), the
#: EndpointSlices kube-apiserver routes webhook Services to (the Endpoints on 1.33,
#: :meth:`_controllers`), and the pods of DaemonSets (the chart's node agent,
#: docs/checkpoint.md).
REAL_NODE_CONTROLLERS = (
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "endpointslice-controller",
    "daemonset-controller",
)
ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTEXT = "rpw-local"
# Only the admission/eviction paths matter to the webhook's tests; everything else stays
# out of the audit log so it costs nothing on the hot path.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "resources": [{"group": "", "resources": ["pods/resize", "pods/eviction"]}],
        },
        {"level": "None"},
    ],
}


@dataclass(frozen=True)
class WebhookClientFiles:
    """Where a control plane keeps what authenticates kube-apiserver to webhooks: the CA a
    webhook is given (``--client-ca``), the client certificate and key it signed (also
    what the harness's own checks of a webhook present), kube-apiserver's kubeconfig
    holding them and its AdmissionConfiguration."""

    ca: Path
    cert: Path
    key: Path
    kubeconfig: Path
    admission_config: Path


def webhook_client_files(state_dir: Path) -> WebhookClientFiles:
    """The files of :class:`WebhookClientFiles` for the control plane in ``state_dir``."""
    pki_dir = state_dir / "pki"
    return WebhookClientFiles(
        ca=pki_dir / "webhook-client-ca.crt",
        cert=pki_dir / "webhook-client.crt",
        key=pki_dir / "webhook-client.key",
        kubeconfig=pki_dir / "webhook-client.kubeconfig",
        admission_config=state_dir / "admission-config.yaml",
    )


class ControlPlaneError(RuntimeError):
    """A component did not start; the message carries the tail of its log."""


@dataclass(frozen=True)
class ControlPlaneConfig:
    """How to start the control plane.

    ``state_dir``: where certificates, kubeconfig, logs and etcd data go; None means a
    temporary directory removed by :meth:`ControlPlane.stop`.
    ``feature_gates``: passed to kube-apiserver, kube-controller-manager and kube-scheduler,
    less those the binaries' version does not know (:meth:`Binaries.settable`).
    ``audit_policy``: replaces :data:`AUDIT_POLICY` (e.g. to log every request when
    counting a component's API calls); None keeps the default.
    ``workload_controllers``: kube-controller-manager also runs
    :data:`WORKLOAD_CONTROLLERS`, so Deployments get ReplicaSets and pods, and lose them
    when removed.
    ``real_nodes``: a kubelet with containers joins (:mod:`harness.realnode`): kube-apiserver
    reaches kubelets at their InternalIP (not by resolving the node's name), calls webhook
    Services at their endpoints (no kube-proxy runs) and gives pods service-account
    credentials (the ``ServiceAccount`` admission plugin), and kube-controller-manager also
    runs :data:`REAL_NODE_CONTROLLERS`.
    """

    state_dir: Path | None = None
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    scheduler: bool = True
    controller_manager: bool = True
    audit: bool = True
    audit_policy: Mapping[str, Any] | None = None
    apiserver_args: Sequence[str] = ()
    start_timeout: float = 60.0
    workload_controllers: bool = False
    real_nodes: bool = False


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A TCP port nothing listens on right now, on any address, and never handed out
    before by this process.

    The OS picks it; two picks in a row may return the same port (both probes are
    closed before anything listens), and the second listener - a webhook replica next
    to another one's metrics port, say - would then fail to bind.
    """
    with _handed_out_lock:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))  # every address: what a 0.0.0.0 listener needs free
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError("no TCP port left that was not handed out already")


class ControlPlane:
    """A running control plane; use ``with ControlPlane(...) as cp:`` or start()/stop()."""

    def __init__(self, binaries: Binaries, config: ControlPlaneConfig | None = None) -> None:
        self.binaries = binaries
        self.config = config or ControlPlaneConfig()
        self._owns_state = self.config.state_dir is None
        self.state_dir = self.config.state_dir or Path(tempfile.mkdtemp(prefix="rpw-cluster-"))
        self.pki_dir = self.state_dir / "pki"
        self.log_dir = self.state_dir / "logs"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.processes: dict[str, ManagedProcess] = {}
        self.ports: dict[str, int] = {}
        self.started_in: float | None = None
        self._client: KubeClient | None = None

    # --- public API -----------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def credentials(self) -> Credentials:
        return Credentials(
            self.server,
            self.pki_dir / "ca.crt",
            self.pki_dir / "admin.crt",
            self.pki_dir / "admin.key",
        )

    @property
    def client(self) -> KubeClient:
        """A shared admin client (the harness's own; tests build the official one)."""
        if self._client is None:
            self._client = KubeClient(self.credentials)
        return self._client

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start everything and wait until kube-apiserver is ready; stops it all on failure."""
        began = time.monotonic()
        try:
            self._prepare()
            self._start_etcd()
            self._start_apiserver()
            self._wait_apiserver_ready()
            # The project's own kinds, as helm installs them from the chart: a service
            # run as a process with checkpoints on stores its records there.
            install_crds(self.client, PROJECT_CRDS)
            if self.config.controller_manager:
                self._start_controller_manager()
            if self.config.scheduler:
                self._start_scheduler()
            self._write_state()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop all components (scheduler and controllers first, etcd last); idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            process = self.processes.pop(name, None)
            if process is not None:
                process.stop()
        if self._owns_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise if a component died (its log tail is in the message)."""
        for name, process in self.processes.items():
            if not process.running():
                raise ControlPlaneError(
                    f"{name} exited with {process.popen.returncode}:\n{process.log_tail()}"
                )

    # --- faults: crash, restart and stall components in place ---------------------------

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver: every connection to it drops at once, watches included."""
        self.processes["kube-apiserver"].kill()

    def start_apiserver(self) -> float:
        """Start kube-apiserver again, same flags, port, certificates and etcd, and wait
        until it is ready; returns the seconds that took. Its log is appended to."""
        began = time.monotonic()
        self._start_apiserver()
        self._wait_apiserver_ready()
        self._write_state()
        return time.monotonic() - began

    def restart_apiserver(self, down_for: float = 0.0) -> float:
        """:meth:`kill_apiserver`, ``down_for`` seconds down, :meth:`start_apiserver`;
        returns the seconds from the kill until it was ready again."""
        began = time.monotonic()
        self.kill_apiserver()
        time.sleep(down_for)
        self.start_apiserver()
        return time.monotonic() - began

    def stall_etcd(self) -> None:
        """SIGSTOP etcd: its connections stay open and nothing answers, as a disk that
        hangs or a paused VM. :meth:`resume_etcd` undoes it; :meth:`stop` too."""
        self.processes["etcd"].signal(signal.SIGSTOP)

    def resume_etcd(self) -> None:
        self.processes["etcd"].signal(signal.SIGCONT)

    def restart_etcd(self, down_for: float = 0.0) -> None:
        """SIGKILL etcd and start it again on its data (``--unsafe-no-fsync``: what it had
        acknowledged before the kill may be lost only if the machine crashes, not here)."""
        self.processes["etcd"].kill()
        time.sleep(down_for)
        self._start_etcd()
        self._write_state()

    # --- steps ----------------------------------------------------------------------------

    def _prepare(self) -> None:
        for d in (self.state_dir, self.pki_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.ports = {
            name: free_port()
            for name in ("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        }
        ca = pki.make_ca("rpw-local-ca")
        serving = pki.make_serving_cert(
            ca,
            dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ip_addresses=["127.0.0.1", "10.0.0.1"],
        )
        admin = harness_pki.make_client_cert(ca, "rpw-admin", groups=["system:masters"])
        kubelet_client = harness_pki.make_client_cert(
            ca, "kube-apiserver-kubelet-client", groups=["system:masters"]
        )
        sa_key = harness_pki.generate_private_key_pem()
        files = {
            "ca.crt": ca.cert_pem,
            "ca.key": ca.key_pem,
            "apiserver.crt": serving.cert_pem,
            "apiserver.key": serving.key_pem,
            "admin.crt": admin.cert_pem,
            "admin.key": admin.key_pem,
            "kubelet-client.crt": kubelet_client.cert_pem,
            "kubelet-client.key": kubelet_client.key_pem,
            "sa.key": sa_key,
            "sa.pub": harness_pki.public_key_pem(sa_key),
        }
        for name, data in files.items():
            path = self.pki_dir / name
            path.write_bytes(data)
            path.chmod(0o600)
        self._write_kubeconfig(ca.cert_pem, admin)
        self._write_webhook_client_auth()
        if self.config.audit:
            policy = self.config.audit_policy or AUDIT_POLICY
            (self.state_dir / "audit-policy.yaml").write_text(yaml.safe_dump(dict(policy)))

    def _write_kubeconfig(self, ca_pem: bytes, admin: pki.KeyPair) -> None:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": CONTEXT,
                    "cluster": {"server": self.server, "certificate-authority-data": b64(ca_pem)},
                }
            ],
            "users": [
                {
                    "name": "rpw-admin",
                    "user": {
                        "client-certificate-data": b64(admin.cert_pem),
                        "client-key-data": b64(admin.key_pem),
                    },
                }
            ],
            "contexts": [
                {
                    "name": CONTEXT,
                    "context": {"cluster": CONTEXT, "user": "rpw-admin", "namespace": "default"},
                }
            ],
            "current-context": CONTEXT,
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _write_webhook_client_auth(self) -> None:
        """A CA of its own for the webhooks' callers, the client certificate kube-apiserver
        presents to every webhook it calls, and the AdmissionConfiguration that makes it
        do so (upstream's "Authenticate apiservers"): a service started with
        ``--client-ca`` that CA answers only kube-apiserver."""
        paths = webhook_client_files(self.state_dir)
        ca = pki.make_ca("rpw-webhook-client-ca")
        # The name a service's client-cn asks for by default.
        client = harness_pki.make_client_cert(ca, DEFAULT_CLIENT_CN)
        for path, data in (
            (paths.ca, ca.cert_pem),
            (paths.cert, client.cert_pem),
            (paths.key, client.key_pem),
        ):
            path.write_bytes(data)
            path.chmod(0o600)

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        # "*": the one user for every webhook, whatever its host and port.
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "users": [
                {
                    "name": "*",
                    "user": {
                        "client-certificate-data": b64(client.cert_pem),
                        "client-key-data": b64(client.key_pem),
                    },
                }
            ],
        }
        paths.kubeconfig.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        paths.kubeconfig.chmod(0o600)
        plugin = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(paths.kubeconfig.resolve()),
        }
        admission = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [
                {"name": name, "configuration": plugin}
                for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
            ],
        }
        paths.admission_config.write_text(yaml.safe_dump(admission, sort_keys=False))

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        self.processes[name] = spawn(name, argv, self.log_dir / f"{name}.log")

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd-client']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=rpw",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=rpw={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

    def _feature_gates_arg(self) -> list[str]:
        # A gate the binary does not know (newer than its version) would stop it from
        # starting; the feature is absent there anyway (control-plane.json lists what was left
        # out).
        gates = (
            self.binaries.settable(self.config.feature_gates) if self.config.feature_gates else {}
        )
        if not gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())]

    def _start_apiserver(self) -> None:
        pki_dir = self.pki_dir
        enable = (
            ["PodResizeValidator"]
            if "PodResizeValidator" in self.binaries.admission_plugins
            else []
        )
        argv = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd-client']}",
            f"--secure-port={self.ports['apiserver']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
            f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
            f"--client-ca-file={pki_dir / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
            *self._real_node_args(),
            # No kubelets: nothing to reconcile the kubernetes Service endpoints against.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *(["--enable-admission-plugins=" + ",".join(enable)] if enable else []),
            f"--admission-control-config-file={webhook_client_files(self.state_dir).admission_config}",
            *self._feature_gates_arg(),
        ]
        if self.config.audit:
            argv += [
                f"--audit-policy-file={self.state_dir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.log_dir / 'audit.log'}",
                "--audit-log-mode=blocking",
            ]
        argv += list(self.config.apiserver_args)
        self._spawn("kube-apiserver", argv)

    def _real_node_args(self) -> list[str]:
        if not self.config.real_nodes:
            # Without a token controller or containers, every pod would be refused for
            # lack of a ``default`` service account.
            return ["--disable-admission-plugins=ServiceAccount"]
        # The kubelet authenticates kube-apiserver's exec/logs calls by this certificate
        # and authorizes them as its user (``system:masters``: every right).
        return [
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={self.pki_dir / 'kubelet-client.crt'}",
            f"--kubelet-client-key={self.pki_dir / 'kubelet-client.key'}",
            "--enable-aggregator-routing=true",
        ]

    def _wait_apiserver_ready(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        client = self.client
        while time.monotonic() < deadline:
            self.check_alive()
            if client.ready(timeout=1.0):
                return
            time.sleep(0.1)
        raise ControlPlaneError(
            "kube-apiserver not ready after "
            f"{self.config.start_timeout:.0f} s:\n{self.processes['kube-apiserver'].log_tail()}"
        )

    def _component_args(self, port_name: str) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports[port_name]}",
            *self._feature_gates_arg(),
        ]

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                *self._component_args("controller-manager"),
                "--controllers=" + ",".join(self._controllers()),
                "--use-service-account-credentials=false",
                *([f"--root-ca-file={self.pki_dir / 'ca.crt'}"] if self.config.real_nodes else []),
            ],
        )

    def _controllers(self) -> list[str]:
        workloads = WORKLOAD_CONTROLLERS if self.config.workload_controllers else ()
        real = REAL_NODE_CONTROLLERS if self.config.real_nodes else ()
        if real and self.binaries.kube_version < (1, 34):
            # kube-apiserver 1.33 routes a webhook's Service by its Endpoints
            # (buildServiceResolver in cmd/kube-apiserver/app/server.go); from 1.34 by its
            # EndpointSlices.
            real = (*real, "endpoints-controller")
        return ["disruption-controller", *workloads, *real]

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [str(self.binaries.kube_scheduler), *self._component_args("scheduler")],
        )

    def _write_state(self) -> None:
        state: dict[str, Any] = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "binaries": str(self.binaries.directory),
            "ports": self.ports,
            "pids": {name: p.pid for name, p in self.processes.items()},
            "feature_gates": dict(self.config.feature_gates),
            "feature_gates_left_out": sorted(
                set(self.config.feature_gates)
                - set(self.binaries.settable(self.config.feature_gates))
            )
            if self.config.feature_gates
            else [],
        }
        (self.state_dir / "control-plane.json").write_text(json.dumps(state, indent=2))

    def wait_components_healthy(self, timeout: float = 30.0) -> None:
        """Wait for /healthz of kube-controller-manager and kube-scheduler."""
        deadline = time.monotonic() + timeout
        for name, port_name in (
            ("kube-controller-manager", "controller-manager"),
            ("kube-scheduler", "scheduler"),
        ):
            if name not in self.processes:
                continue
            url = f"https://127.0.0.1:{self.ports[port_name]}/healthz"
            while not _healthy(url):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise ControlPlaneError(
                        f"{name} not healthy:\n{self.processes[name].log_tail()}"
                    )
                time.sleep(0.1)


def _healthy(url: str) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # components serve self-signed in-memory certificates
    try:
        with urllib.request.urlopen(url, context=context, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False
