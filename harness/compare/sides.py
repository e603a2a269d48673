"""The two sides of the comparison, each on its own local control plane.

* ``ours``: kube-apiserver, kube-scheduler and kube-controller-manager v1.37.2 with the
  alpha gate off; the webhook service (``python -m webhook serve --victim-order
  movable-first``) started and registered for ``pods/resize`` by
  :func:`harness.webhook_process.start_webhook`. Where no candidate has a controller that
  recreates it (every scenario but ``move-dont-lose``), movable-first plans exactly as the
  default order.
* ``upstream``: the same binaries with ``InPlacePodVerticalScalingSchedulerPreemption=true``
  on every component (the API server must have it too, or it drops
  ``Node.spec.podPreemptionPolicy``); no webhook registered and no service process, so
  nothing of ours reconciles Deferred resizes: kube-scheduler alone preempts.

On both sides kube-controller-manager also runs the ReplicaSet controller (and the
garbage collector, which removes a ReplicaSet's pods with it), so an evicted ReplicaSet
pod gets a replacement for kube-scheduler to place. Both sides run the same hollow
kubelets (the v1.37.2 kubelet without containers, one process per node: Deferred when a
resize does not fit, actuation when room appears, containers stopped within
``GRACE_CAP`` seconds) and log every API request to the audit log, so the preempting
component's requests can be counted by user agent: ``resize-preemption-webhook/<version>``
(every client the service builds sets it) and ``kube-scheduler/<version> ...``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from harness.binaries import Binaries, ensure_binaries
from harness.compare.measure import AUDIT_EVERYTHING
from harness.kubeapi import ApiError, KubeClient
from harness.launcher import ControlPlane, ControlPlaneConfig
from harness.nodes import HollowNodes, NodeOptions
from harness.webhook_process import NAMESPACE, WebhookProcess, start_webhook
from webhook.kube.client import USER_AGENT

GATE = "InPlacePodVerticalScalingSchedulerPreemption"
SIDES = ("ours", "upstream")
#: Our webhook set up to behave as kube-scheduler does: its removal (``DisruptionTarget``,
#: then DELETE) and PodDisruptionBudgets that only steer the choice. Not in ``make
#: compare``'s table (that compares defaults); the e2e test runs it on the PDB scenarios
#: to show the one policy difference in victims is a default, not accounting.
UPSTREAM_POLICY = "ours-upstream-policy"
#: ``python -m webhook serve`` flags of each side that runs the webhook.
WEBHOOK_FLAGS: dict[str, tuple[str, ...]] = {
    "ours": ("--victim-order", "movable-first"),
    UPSTREAM_POLICY: ("--eviction-method", "delete", "--pdb-mode", "best-effort"),
}
ALL_SIDES = (*SIDES, UPSTREAM_POLICY)
GRACE_CAP = 1.0
LEADER_LEASE = "resize-preemption-webhook-leader"


@dataclass
class Side:
    """A running side: control plane, kubelets and (ours) the webhook service."""

    name: str
    binaries: Binaries
    state_dir: Path
    control_plane: ControlPlane | None = None
    nodes: HollowNodes | None = None
    webhook: WebhookProcess | None = None
    #: Longest a victim's containers take to stop; None: their whole grace period.
    grace_cap: float | None = GRACE_CAP
    _owns_dir: bool = False
    _priority_classes: set[str] = field(default_factory=set)

    @property
    def user_agent_prefix(self) -> str:
        """How the preempting component shows in the audit log."""
        return USER_AGENT if self.runs_webhook else "kube-scheduler/"

    @property
    def runs_webhook(self) -> bool:
        return self.name in WEBHOOK_FLAGS

    @property
    def client(self) -> KubeClient:
        assert self.control_plane is not None
        return self.control_plane.client

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane is not None
        return self.control_plane.kubeconfig

    @property
    def audit_log(self) -> Path:
        return self.state_dir / "logs" / "audit.log"

    def __enter__(self) -> Side:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> Side:
        gates = {GATE: True} if self.name == "upstream" else {}
        config = ControlPlaneConfig(
            state_dir=self.state_dir,
            feature_gates=gates,
            audit_policy=AUDIT_EVERYTHING,
            workload_controllers=True,
        )
        try:
            self.control_plane = ControlPlane(self.binaries, config).start()
            self.control_plane.wait_components_healthy(timeout=60)
            self.nodes = HollowNodes(
                self.control_plane,
                [],
                NodeOptions(stop_grace_cap=self.grace_cap, feature_gates=gates),
            ).start()
            if self.runs_webhook:
                self.webhook = start_webhook(
                    self.control_plane.client,
                    self.control_plane.kubeconfig,
                    self.state_dir,
                    extra_args=WEBHOOK_FLAGS[self.name],
                )
                self._wait_leader()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None
        if self.nodes is not None:
            self.nodes.stop()
            self.nodes = None
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        if self._owns_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _wait_leader(self, timeout: float = 60.0) -> None:
        """The preemption worker acts only as leader: wait until it holds the Lease."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEADER_LEASE}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.client.get(path).get("spec", {}).get("holderIdentity"):
                    return
            except ApiError as e:
                if e.status != 404:
                    raise
            time.sleep(0.2)
        raise TimeoutError(f"the webhook did not take the leader Lease {LEADER_LEASE}")

    def ensure_priority_class(self, value: int, never: bool) -> str:
        name = f"cmp-{value}" + ("-never" if never else "")
        if name not in self._priority_classes:
            body = {"metadata": {"name": name}, "value": value}
            if never:
                body["preemptionPolicy"] = "Never"
            try:
                self.client.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
            except ApiError as e:
                if e.status != 409:
                    raise
            self._priority_classes.add(name)
        return name


def make_side(
    name: str,
    state_dir: Path | None = None,
    binaries: Binaries | None = None,
    grace_cap: float | None = GRACE_CAP,
) -> Side:
    """A side not started yet; ``state_dir`` None: a temporary directory removed on stop."""
    if name not in ALL_SIDES:
        raise ValueError(f"unknown side {name!r}")
    owns = state_dir is None
    directory = state_dir or Path(tempfile.mkdtemp(prefix=f"rpw-compare-{name}-"))
    side = Side(name, binaries or ensure_binaries(), directory, grace_cap=grace_cap)
    side._owns_dir = owns
    return side
