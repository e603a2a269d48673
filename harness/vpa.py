"""The Vertical Pod Autoscaler's updater next to the local control plane.

Only the updater runs: it is the VPA component that resizes pods (``pods/resize``, in the
``InPlace`` and ``InPlaceOrRecreate`` update modes) and evicts them. There is no
recommender (no metrics pipeline here: whoever drives the cluster writes the VPA object's
``status.recommendation``, see :func:`write_recommendation`) and no admission controller
(it only sets requests of new pods; the updater is told not to wait for it).

``scripts/build-vpa.sh`` builds the updater of ``k8s.io/autoscaler/vertical-pod-autoscaler``
(default v1.8.1) from the Go module proxy and copies the module's own CRD manifest beside
it; :func:`ensure_vpa` runs it. :class:`VpaUpdater` installs the CRDs, gives the updater a
client certificate of its own (user ``vpa-updater``, so the audit log and the webhook see
who resizes) and starts it with :func:`updater_argv`'s flags (docs/vpa.md explains each).

The updater's workloads need owners: start the control plane with
``ControlPlaneConfig(workload_controllers=True)`` (deployment and replicaset controllers).
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import pki as harness_pki
from harness.binaries import REPO_ROOT
from harness.crds import install_crds
from harness.kubeapi import ApiError, KubeClient
from harness.launcher import ControlPlane, free_port
from harness.processes import ManagedProcess, spawn
from webhook.tls import pki

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-vpa.sh"
UPDATER = "vpa-updater"
CRD_FILE = "vpa-v1-crd-gen.yaml"
API = "/apis/autoscaling.k8s.io/v1"
#: The updater's user name in the API server (its client certificate's common name).
USER = "vpa-updater"
#: Every update mode that resizes in place.
IN_PLACE_MODES = ("InPlace", "InPlaceOrRecreate")
#: pkg/updater/restriction: how long InPlaceOrRecreate waits for a Deferred resize before
#: it evicts the pod instead (a constant in v1.8.1, no flag changes it).
DEFERRED_RESIZE_TIMEOUT = 300.0
#: Counted once per loop of the updater (pkg/utils/metrics/updater).
LOOP_METRIC = 'vpa_updater_execution_latency_seconds_count{step="total"}'

__all__ = [
    "UpdaterOptions",
    "VpaBinaries",
    "VpaError",
    "VpaUpdater",
    "deployment_manifest",
    "ensure_vpa",
    "install_crds",
    "remove_workloads",
    "updater_argv",
    "vpa_manifest",
    "write_recommendation",
]


class VpaError(RuntimeError):
    """VPA could not be built or the updater did not start; the message says why."""


@dataclass(frozen=True)
class VpaBinaries:
    """The directory holding ``vpa-updater`` and the module's CRD manifest."""

    directory: Path

    @property
    def updater(self) -> Path:
        return self.directory / UPDATER

    @property
    def crds(self) -> Path:
        return self.directory / CRD_FILE

    @property
    def version(self) -> str:
        """The VPA module version it was built from, e.g. "v1.8.1"."""
        return (self.directory / "VERSION").read_text().strip()


def ensure_vpa(*, quiet: bool = False) -> VpaBinaries:
    """Return the updater and CRDs, building them if needed (progress goes to stderr).

    A cold build takes a few minutes on two cores (most of its packages are client-go's,
    shared with the control plane's build cache); later calls return at once.
    """
    stderr = subprocess.DEVNULL if quiet else sys.stderr
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=stderr, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise VpaError(f"{BUILD_SCRIPT.name} failed (exit {result.returncode}); run it to see why")
    binaries = VpaBinaries(Path(lines[-1]))
    if not binaries.updater.exists() or not binaries.crds.exists():
        raise VpaError(f"{binaries.directory} lacks {UPDATER} or {CRD_FILE}")
    return binaries


@dataclass(frozen=True)
class UpdaterOptions:
    """The updater's settings for a test cluster (docs/vpa.md, "The updater's flags").

    ``interval``: seconds between the updater's loops (VPA's default is a minute).
    ``min_replicas``: the least replicas a workload needs to be updated (VPA's default 2
    leaves a single-replica Deployment alone).
    ``feature_gates``: VPA's own gates; ``InPlace`` (alpha in v1.8.1, off by default)
    enables the ``InPlace`` update mode. ``InPlaceOrRecreate`` needs none since v1.7.0.
    ``verbosity``: klog level; 4 logs every in-place decision ("In-place update deferred").
    """

    interval: float = 2.0
    min_replicas: int = 1
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: {"InPlace": True})
    verbosity: int = 4
    extra_args: Sequence[str] = ()


def updater_argv(
    binary: Path, kubeconfig: Path, address: str, options: UpdaterOptions
) -> list[str]:
    """The updater's command line; ``address`` serves its /metrics and /health-check."""
    argv = [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--updater-interval={options.interval:g}s",
        f"--min-replicas={options.min_replicas}",
        # No admission controller runs: with its status checked, every loop is skipped.
        "--use-admission-controller-status=false",
        f"--address={address}",
        f"--v={options.verbosity}",
    ]
    if options.feature_gates:
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in options.feature_gates.items())
        argv.append(f"--feature-gates={gates}")
    argv += list(options.extra_args)
    return argv


class VpaUpdater:
    """The VPA updater of a running control plane; a context manager or start()/stop().

    Start installs the CRDs and returns once the updater has completed a loop (its
    informers are synced then); it acts on every VPA object in the cluster from then on.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        binaries: VpaBinaries,
        options: UpdaterOptions | None = None,
        *,
        start_timeout: float = 60.0,
    ) -> None:
        self.control_plane = control_plane
        self.binaries = binaries
        self.options = options or UpdaterOptions()
        self.start_timeout = start_timeout
        self.port = 0
        self.process: ManagedProcess | None = None

    def __enter__(self) -> VpaUpdater:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log_path(self) -> Path:
        return self.control_plane.log_dir / f"{UPDATER}.log"

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.state_dir / f"{UPDATER}.kubeconfig"

    def start(self) -> VpaUpdater:
        install_crds(self.control_plane.client, self.binaries.crds)
        self._write_kubeconfig()
        self.port = free_port()
        argv = updater_argv(
            self.binaries.updater, self.kubeconfig, f"127.0.0.1:{self.port}", self.options
        )
        self.process = spawn(UPDATER, argv, self.log_path)
        try:
            self._wait_first_loop()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the updater (the CRDs and VPA objects stay); idempotent."""
        if self.process is not None:
            self.process.stop()
            self.process = None

    def check_alive(self) -> None:
        if self.process is not None and not self.process.running():
            raise VpaError(
                f"{UPDATER} exited with {self.process.popen.returncode}:\n{self.process.log_tail()}"
            )

    def loops(self) -> int:
        """How many loops the updater has completed (0 while it cannot be reached)."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return 0
        match = re.search(re.escape(LOOP_METRIC) + r" (\S+)", text)
        return int(float(match.group(1))) if match else 0

    def _wait_first_loop(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while self.loops() < 1:
            self.check_alive()
            if time.monotonic() > deadline:
                tail = self.process.log_tail() if self.process else ""
                raise VpaError(f"{UPDATER} ran no loop in {self.start_timeout:.0f} s:\n{tail}")
            time.sleep(0.2)

    def _write_kubeconfig(self) -> None:
        """A kubeconfig with a client certificate for ``vpa-updater`` (a cluster admin, as
        the updater's own RBAC would be far more work for no test that needs it)."""
        pki_dir = self.control_plane.pki_dir
        ca = pki.CertificateAuthority(
            cert_pem=(pki_dir / "ca.crt").read_bytes(), key_pem=(pki_dir / "ca.key").read_bytes()
        )
        user = harness_pki.make_client_cert(ca, USER, groups=["system:masters"])

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.control_plane.server,
                        "certificate-authority-data": b64(ca.cert_pem),
                    },
                }
            ],
            "users": [
                {
                    "name": USER,
                    "user": {
                        "client-certificate-data": b64(user.cert_pem),
                        "client-key-data": b64(user.key_pem),
                    },
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": USER}}],
            "current-context": "local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)


# -- VPA objects ------------------------------------------------------------------------------


def vpa_manifest(
    name: str, deployment: str, mode: str, *, controlled: str = "RequestsAndLimits"
) -> dict[str, Any]:
    """A VerticalPodAutoscaler for Deployment ``deployment`` in update mode ``mode``.

    ``controlled``: ``RequestsAndLimits`` keeps a Guaranteed pod Guaranteed (limits move
    in proportion with requests).
    """
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "updatePolicy": {"updateMode": mode},
            "resourcePolicy": {
                "containerPolicies": [{"containerName": "*", "controlledValues": controlled}]
            },
        },
    }


def write_recommendation(
    client: KubeClient,
    namespace: str,
    name: str,
    containers: Mapping[str, Mapping[str, str]],
) -> dict[str, Any]:
    """Write ``status.recommendation`` of VPA ``namespace/name`` as a recommender would:
    ``{container: {"cpu": "4", "memory": "256Mi"}}`` as target, lower and upper bound.

    Bounds equal to the target put any other request outside the recommended range, which
    is what makes the updater act on a pod younger than 12 hours (its
    ``--in-recommendation-bounds-eviction-lifetime-threshold``).
    """
    recommendations = [
        {
            "containerName": container,
            "target": dict(resources),
            "lowerBound": dict(resources),
            "upperBound": dict(resources),
            "uncappedTarget": dict(resources),
        }
        for container, resources in containers.items()
    ]
    body = {
        "status": {
            "recommendation": {"containerRecommendations": recommendations},
            "conditions": [
                {
                    "type": "RecommendationProvided",
                    "status": "True",
                    "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            ],
        }
    }
    path = f"{API}/namespaces/{namespace}/verticalpodautoscalers/{name}/status"
    result: dict[str, Any] = client.patch(path, body)
    return result


def deployment_manifest(
    name: str,
    cpu: str,
    priority_class: str,
    *,
    memory: str = "256Mi",
    node: str = "node-1",
    container: str = "app",
    image: str = "registry.k8s.io/pause:3.10",
) -> dict[str, Any]:
    """A Deployment of one Guaranteed pod (``app=<name>``, requests = limits) bound to
    ``node``: bound, so kube-scheduler never places or preempts for it, and a grace period
    of 1 s, so an eviction by VPA's fallback is quick."""
    resources = {"cpu": cpu, "memory": memory}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeName": node,
                    "priorityClassName": priority_class,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": container,
                            "image": image,
                            "resources": {"requests": resources, "limits": dict(resources)},
                        }
                    ],
                },
            },
        },
    }


def remove_workloads(client: KubeClient, namespace: str) -> None:
    """Delete the VPA objects, Deployments and ReplicaSets of ``namespace``, so nothing
    recreates the pods; the caller removes the pods at once (the garbage collector would
    too, but only after the pods' grace period)."""
    for path in (
        f"{API}/namespaces/{namespace}/verticalpodautoscalers",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        f"/apis/apps/v1/namespaces/{namespace}/replicasets",
    ):
        try:
            client.delete(path)
        except ApiError as e:
            if e.status != 404:
                raise
