"""The comparison's two sides on the real node (:class:`harness.realcluster.RealCluster`:
``node-1`` the real kubelet on containerd) and its scenarios scaled to the CPU node-1 has
free.

* ``ours``: the alpha gate off everywhere; the webhook installed by its Helm chart from the
  locally built image (two replicas on node-1, called by kube-apiserver through the
  chart's Service);
* ``upstream``: ``InPlacePodVerticalScalingSchedulerPreemption=true`` on kube-apiserver,
  kube-scheduler, kube-controller-manager and the kubelet; no webhook. Two pods with the
  chart's priority class and requests take the room the chart's replicas take on the
  other side, so both sides scale the scenarios to the same free CPU.

The scenarios are scaled as :func:`harness.walkthrough.scaled_walkthrough` scales the
walkthrough: every size times free / the scenario's node size, rounded down to 10m (the
lending floors too). Each pod runs the workload image with a process that traps SIGTERM
and then sleeps the pod's grace period before it exits, so a victim's removal really takes
it. The benchmark that runs them is ``python -m bench.realcompare``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import yaml

from harness import quantity
from harness.binaries import REPO_ROOT, ensure_binaries
from harness.chart import CHART, NAMESPACE
from harness.compare import scenarios as sc
from harness.compare.measure import AUDIT_EVERYTHING
from harness.compare.runner import ScenarioRun
from harness.compare.sides import GATE, SIDES, Side
from harness.images import Role
from harness.kubeapi import ApiError
from harness.manifests import workload_pod
from harness.nodes import HollowNodes
from harness.realcluster import RealCluster, RealClusterOptions
from harness.realnode import (
    NODE_NAME,
    Images,
    NodeStack,
)
from harness.walkthrough import STEP
from webhook.core.model import FLOOR_ANNOTATION

RESULTS = REPO_ROOT / "bench" / "results" / "compare-realnode.json"
SCENARIOS: tuple[Callable[[], sc.Scenario], ...] = (
    sc.walkthrough,
    sc.mixed_priorities,
    sc.lending,
)
GRACES = (0, 5)
#: Where the upstream side keeps the room the chart's replicas take on our side.
ROOM_NAMESPACE = "chart-room"
LEADER_LEASE = "resize-preemption-webhook-leader"

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def victim_script(grace: int) -> str:
    """A process that, on SIGTERM, takes ``grace`` seconds before it exits (busybox sh runs
    the trap when ``wait`` returns, not after a whole ``sleep``)."""
    return f"trap 'sleep {grace}; exit 0' TERM; while true; do sleep 1 & wait $!; done"


# --- scaling --------------------------------------------------------------------------------


def scaled(scenario: sc.Scenario, free: int, step: int = STEP) -> sc.Scenario:
    """``scenario`` with every CPU size (pods, resizes, lending floors) times ``free``
    millicores over its node's size, rounded down to ``step``; on one node of ``free``."""
    whole = quantity.milli_value(scenario.node_cpu)

    def cpu(text: str) -> str:
        return f"{quantity.milli_value(text) * free // whole // step * step}m"

    def floors(annotations: Mapping[str, str]) -> dict[str, str]:
        out = dict(annotations)
        if FLOOR_ANNOTATION in out:
            per_container = json.loads(out[FLOOR_ANNOTATION])
            for floor in per_container.values():
                if "cpu" in floor:
                    floor["cpu"] = cpu(floor["cpu"])
            out[FLOOR_ANNOTATION] = json.dumps(per_container)
        return out

    if scenario.nodes != 1:
        raise ValueError(f"{scenario.name}: the real node is one node")
    return replace(
        scenario,
        node_cpu=f"{free}m",
        pods=tuple(
            replace(p, cpu=cpu(p.cpu), annotations=floors(p.annotations)) for p in scenario.pods
        ),
        resizes=tuple(replace(r, cpu=cpu(r.cpu)) for r in scenario.resizes),
        pending=tuple(replace(r, cpu=cpu(r.cpu)) for r in scenario.pending),
    )


def sizes(scenario: sc.Scenario) -> dict[str, Any]:
    """The scaled sizes, as the results file records them."""
    return {
        "pods": {p.name: p.cpu for p in scenario.pods},
        "resizes": {r.pod: r.cpu for r in scenario.resizes},
        "floors": {
            p.name: json.loads(p.annotations[FLOOR_ANNOTATION])
            for p in scenario.pods
            if FLOOR_ANNOTATION in p.annotations
        },
    }


# --- the sides ------------------------------------------------------------------------------


class _RealNodeOnly:
    """What a scenario asks of a side's nodes, for a side whose one node is the real
    node-1: every scenario shares it, none adds or removes a node."""

    names: tuple[str, ...] = ()

    def add_node(self, spec: object) -> None:
        return None


@dataclass
class RealSide(Side):
    """A side of :mod:`harness.compare.sides` whose node is the real node-1."""

    stack: NodeStack | None = None
    images: Images | None = None
    cluster: RealCluster | None = None

    def start(self) -> RealSide:
        assert self.stack is not None and self.images is not None
        gates = {GATE: True} if self.name == "upstream" else {}
        options = RealClusterOptions(
            feature_gates=gates,
            with_chart=self.runs_webhook,
            state_dir=self.state_dir,
            audit_policy=AUDIT_EVERYTHING,
        )
        try:
            self.cluster = RealCluster(self.binaries, self.stack, self.images, options).start()
            self.control_plane = self.cluster.control_plane
            self.nodes = cast(HollowNodes, _RealNodeOnly())
            if self.runs_webhook:
                self._wait_leader()
            else:
                self._take_the_charts_room()
        except BaseException:
            self.stop()
            raise
        return self

    @classmethod
    def around(cls, cluster: RealCluster, name: str) -> RealSide:
        """A side on a cluster that runs already; whoever started it stops it."""
        side = cls(name, cluster.binaries, cluster.control_plane.state_dir, grace_cap=None)
        side.cluster = cluster
        side.control_plane = cluster.control_plane
        side.nodes = cast(HollowNodes, _RealNodeOnly())
        return side

    def wait_leader(self) -> None:
        self._wait_leader()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        self.control_plane = None
        self.nodes = None
        if self._owns_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def image(self, role: Role) -> str:
        assert self.cluster is not None
        return self.cluster.image(role)

    def free_millicores(self) -> tuple[int, int]:
        """node-1's allocatable CPU and what its pods request, in millicores."""
        assert self.cluster is not None
        return self.cluster.allocatable_millicores(), self.cluster.requested_millicores()

    def _wait_leader(self, timeout: float = 120.0) -> None:
        """The chart's replicas preempt only as leader: wait until one holds the Lease."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEADER_LEASE}"
        deadline = time.monotonic() + timeout
        while not (self.client.get_or_none(path) or {}).get("spec", {}).get("holderIdentity"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica of the chart took the Lease {LEADER_LEASE}")
            time.sleep(0.2)

    def _take_the_charts_room(self) -> None:
        """Pods with the chart's priority class and requests, one per replica: node-1 has
        the same CPU and memory free on both sides, held by pods no resize can preempt."""
        assert self.cluster is not None
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        self.cluster.create_namespace(ROOM_NAMESPACE)
        pods = [
            workload_pod(
                f"chart-room-{i}",
                self.image("workload"),
                values["priorityClassName"],
                {"requests": values["resources"]["requests"]},
                node=NODE_NAME,
                script=victim_script(0),
                grace_seconds=0,
                dns_policy="Default",
            )
            for i in range(int(values["replicaCount"]))
        ]
        self.cluster.kubectl(
            "apply", "-n", ROOM_NAMESPACE, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
        )  # fmt: skip
        names = [f"pod/{p['metadata']['name']}" for p in pods]
        self.cluster.kubectl(
            "wait", "-n", ROOM_NAMESPACE, "--for=condition=Ready", *names, "--timeout=120s"
        )


def make_real_side(
    name: str, stack: NodeStack, images: Images, state_dir: Path | None = None
) -> RealSide:
    """A side not started yet; ``state_dir`` None: a temporary directory removed on stop."""
    if name not in SIDES:
        raise ValueError(f"unknown side {name!r}")
    directory = state_dir or Path(tempfile.mkdtemp(prefix=f"rpw-realcompare-{name}-"))
    side = RealSide(name, ensure_binaries(), directory, grace_cap=None, stack=stack, images=images)
    side._owns_dir = state_dir is None
    return side


class RealScenarioRun(ScenarioRun):
    """A scenario on node-1: its pods run the workload image with a process that takes
    the pod's grace period after SIGTERM."""

    def __init__(
        self, side: RealSide, scenario: sc.Scenario, tag: str, log: Log, victim_grace: int
    ) -> None:
        super().__init__(side, scenario, tag, log, victim_grace)
        self.real = side
        self.nodes = [NODE_NAME]
        self._account_ready = False

    def _pod_object(self, p: sc.PodSpec) -> dict[str, Any]:
        pod = super()._pod_object(p)
        spec = pod["spec"]
        # No cluster DNS and no kube-proxy run: the node's resolver, no Service variables.
        spec.update(dnsPolicy="Default", enableServiceLinks=False)
        container = spec["containers"][0]
        container["image"] = self.real.image("workload")
        container["command"] = ["sh", "-c", victim_script(self.victim_grace or 0)]
        return pod

    def _create(self, pod: dict[str, Any]) -> None:
        if not self._account_ready:
            # The ServiceAccount admission plugin refuses pods until the namespace's
            # default account exists.
            path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default"
            self._wait(lambda: self.real.client.get_or_none(path), 30, "the default account")
            self._account_ready = True
        super()._create(pod)

    def cleanup(self) -> None:
        super().cleanup()
        try:
            self._wait(lambda: not self._pods(), 60, f"{self.namespace}'s pods gone")
        except (TimeoutError, ApiError) as e:
            self.log(f"  cleanup of {self.namespace}: {e}")
