"""A local cluster whose ``node-1`` runs containers, with the product installed by its chart.

:class:`RealCluster` is the one way ``make cluster NODE=real``, ``make demo NODE=real`` and
the real-node end-to-end tests get such a cluster:

* the control plane (:class:`harness.launcher.ControlPlane`) with ``real_nodes`` and the
  workload controllers (the chart's Deployment gets its pods);
* ``node-1``: the real kubelet on containerd (:class:`harness.realnode.RealNode`);
* ``node-2`` .. ``node-N``: hollow kubelets (:mod:`harness.nodes`) for work that needs more
  nodes than one machine has; they run no containers;
* or, added while it runs (:meth:`RealCluster.add_real_node`), another real kubelet on
  containerd beside node-1 (``node-2``: its own state, bridges, pod subnet and cgroup root,
  :class:`harness.realnode.NodeSlot`), removed again by :meth:`RealCluster.remove_real_node`;
* optionally the webhook, installed with the Helm chart from the locally built image
  (:mod:`harness.chart`): pods in ``rpw-system`` behind the chart's Service, which is how
  kube-apiserver calls them; pinned to ``node-1`` when other nodes exist.

Helpers for tests and the demo: :meth:`RealCluster.kubectl`, :meth:`RealCluster.exec`,
:meth:`RealCluster.cpu_quota` (a container's CFS quota read from inside it, cgroup v1 or
v2), :meth:`RealCluster.image_id`, :meth:`RealCluster.install_chart`.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from harness import chart
from harness.binaries import Binaries
from harness.images import Role
from harness.kubeapi import ApiError, KubeClient
from harness.kubectl import Kubectl
from harness.launcher import ControlPlane, ControlPlaneConfig
from harness.nodes import HollowNodes, NodeError, NodeOptions, NodeSpec
from harness.realnode import NODE_NAME, Images, NodeSlot, NodeStack, RealNode, RealNodeOptions

#: Prints the container's CPU quota and period, one number or ``max`` each: cgroup v2's
#: ``cpu.max`` when the container sees the unified hierarchy, else v1's two files.
CPU_QUOTA_COMMAND = (
    "cat /sys/fs/cgroup/cpu.max 2>/dev/null || "
    "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us"
)
#: Prints the container's memory limit (``max``: none) and its usage in bytes, one a line:
#: cgroup v2's files when the container sees the unified hierarchy, else v1's.
MEMORY_COMMAND = (
    "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory.current 2>/dev/null || "
    "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory/memory.usage_in_bytes"
)
#: cgroup v1's "no limit": the largest page-aligned signed 64-bit value.
V1_UNLIMITED = 9223372036854771712


@dataclass(frozen=True)
class CpuQuota:
    """A container's CFS bandwidth: ``quota_us`` per ``period_us`` (None: unlimited)."""

    quota_us: int | None
    period_us: int

    @property
    def millicores(self) -> int | None:
        if self.quota_us is None:
            return None
        return int(Fraction(self.quota_us * 1000, self.period_us))


def parse_cpu_quota(text: str) -> CpuQuota:
    """What :data:`CPU_QUOTA_COMMAND` printed: ``"150000 100000"`` (v2) or
    ``"150000\\n100000"`` (v1); ``max`` (v2) and ``-1`` (v1) mean unlimited."""
    words = text.split()
    if len(words) != 2:
        raise ValueError(f"not a CPU quota and period: {text!r}")
    quota, period = words
    unlimited = quota in ("max", "-1")
    return CpuQuota(None if unlimited else int(quota), int(period))


@dataclass(frozen=True)
class MemoryUse:
    """A container's memory cgroup: its limit (None: unlimited) and what it uses, in bytes."""

    limit: int | None
    usage: int


def parse_memory(text: str) -> MemoryUse:
    """What :data:`MEMORY_COMMAND` printed: the limit then the usage, one a line."""
    words = text.split()
    if len(words) != 2:
        raise ValueError(f"not a memory limit and usage: {text!r}")
    limit, usage = words
    unlimited = limit == "max" or int(limit) >= V1_UNLIMITED
    return MemoryUse(None if unlimited else int(limit), int(usage))


@dataclass(frozen=True)
class RealClusterOptions:
    """What to start.

    ``nodes``: node-1 real, node-2..N hollow (``hollow_cpu``/``hollow_memory``/``hollow_pods``
    each). ``with_chart``: install the webhook with the chart once the nodes are ready.
    ``grace_cap``: how long a hollow node's containers take to stop at most (None: the whole
    grace period); real containers take what their processes take. ``audit_policy``:
    kube-apiserver's audit policy instead of the control plane's default one.
    """

    nodes: int = 1
    hollow_cpu: str = "8"
    hollow_memory: str = "16Gi"
    hollow_pods: int = 110
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    grace_cap: float | None = None
    with_chart: bool = True
    state_dir: Path | None = None
    audit_policy: Mapping[str, Any] | None = None


class RealCluster:
    """Use as a context manager or start()/stop(); everything stops on failure."""

    def __init__(
        self,
        binaries: Binaries,
        stack: NodeStack,
        images: Images,
        options: RealClusterOptions | None = None,
    ) -> None:
        self.binaries = binaries
        self.stack = stack
        self.images = images
        self.options = options or RealClusterOptions()
        self.control_plane = ControlPlane(
            binaries,
            ControlPlaneConfig(
                state_dir=self.options.state_dir,
                feature_gates=self.options.feature_gates,
                workload_controllers=True,
                real_nodes=True,
                audit_policy=self.options.audit_policy,
            ),
        )
        self.node: RealNode | None = None
        self.hollow: HollowNodes | None = None
        #: Real nodes beside node-1, by name (:meth:`add_real_node`).
        self.others: dict[str, RealNode] = {}
        self.release: chart.Release | None = None
        self.started_in: float | None = None

    def __enter__(self) -> RealCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> RealCluster:
        began = time.monotonic()
        options = self.options
        try:
            self.control_plane.start()
            self.node = RealNode(
                self.control_plane,
                self.stack,
                self.images,
                RealNodeOptions(feature_gates=options.feature_gates),
            ).start()
            if options.nodes > 1:
                specs = [
                    NodeSpec(f"node-{i}", options.hollow_cpu, options.hollow_memory,
                             options.hollow_pods)
                    for i in range(2, options.nodes + 1)
                ]  # fmt: skip
                node_options = NodeOptions(
                    stop_grace_cap=options.grace_cap, feature_gates=options.feature_gates
                )
                self.hollow = HollowNodes(self.control_plane, specs, node_options).start()
            if options.with_chart:
                self.install_chart()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop the nodes (the real ones remove their containers), then the control plane."""
        for other in list(self.others.values()):
            other.stop()
        self.others.clear()
        if self.hollow is not None:
            self.hollow.stop()
            self.hollow = None
        if self.node is not None:
            self.node.stop()
            self.node = None
        self.control_plane.stop()

    def check_alive(self) -> None:
        """Raise if a control-plane component, containerd or a kubelet died."""
        self.control_plane.check_alive()
        if self.node is not None:
            self.node.check_alive()
        for other in self.others.values():
            other.check_alive()
        if self.hollow is not None:
            self.hollow.check_alive()

    @property
    def errors(self) -> list[str]:
        """One line per node process that exited without being stopped."""
        return [
            *(self.node.errors if self.node else []),
            *(e for other in self.others.values() for e in other.errors),
            *(self.hollow.errors if self.hollow else []),
        ]

    @property
    def node_names(self) -> list[str]:
        return [NODE_NAME, *self.others, *(self.hollow.names if self.hollow else [])]

    def pids(self) -> dict[str, int]:
        """Process ids of the node processes, by name (for the state file)."""
        found: dict[str, int] = {}
        if self.node is not None:
            found |= {f"{name}-{NODE_NAME}": p.pid for name, p in self.node.processes.items()}
        for node_name, other in self.others.items():
            found |= {f"{name}-{node_name}": p.pid for name, p in other.processes.items()}
        if self.hollow is not None:
            found |= {name: self.hollow.pid(name) for name in self.hollow.names}
        return found

    def add_real_node(self, index: int = 2) -> RealNode:
        """Start ``node-<index>``, a real kubelet on containerd beside node-1 (same stack,
        same images imported, the cluster's feature gates), and wait until it is Ready.
        While it runs, :meth:`install_chart` pins the webhook's pods to node-1."""
        slot = NodeSlot(index)
        if slot.first or slot.name in self.others:
            raise NodeError(f"{slot.name} runs already")
        node = RealNode(
            self.control_plane,
            self.stack,
            self.images,
            RealNodeOptions(feature_gates=self.options.feature_gates, slot=slot),
        ).start()
        self.others[node.name] = node
        return node

    def remove_real_node(self, name: str, timeout: float = 60.0) -> None:
        """Stop the real node ``name`` (its containers removed), then remove what the API
        server kept of it: the pods bound to it (no kubelet is left to finish them), its
        Node and its Lease; the cluster is as before :meth:`add_real_node`."""
        node = self.others.pop(name, None)
        if node is not None:
            node.stop()
        # The Node first: no DaemonSet makes a pod for it again.
        for path in (
            f"/api/v1/nodes/{name}",
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}",
        ):
            try:
                self.client.delete(path)
            except ApiError as e:
                if e.status != 404:  # the Lease goes with its Node, by its owner reference
                    raise
        deadline = time.monotonic() + timeout
        while pods := self._bound_to(name):
            if time.monotonic() > deadline:
                raise NodeError(f"pods bound to {name} were not removed: {pods}")
            for path in pods:
                with contextlib.suppress(ApiError):  # gone meanwhile
                    self.client.delete(path, body={"gracePeriodSeconds": 0})
            time.sleep(0.2)

    def _bound_to(self, node: str) -> list[str]:
        pods = self.client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]
        return [
            f"/api/v1/namespaces/{p['metadata']['namespace']}/pods/{p['metadata']['name']}"
            for p in pods
        ]

    # --- the chart -----------------------------------------------------------------------------

    def install_chart(self, extra_values: Mapping[str, Any] | None = None) -> chart.Release:
        """``helm upgrade --install`` the chart (image: the product image built locally, the
        chart's default reference) and wait until its pods serve behind the Service."""
        pin = NODE_NAME if self.hollow is not None or self.others else None
        self.release = chart.install(
            self.client, self.kubeconfig, pin_node=pin, extra_values=extra_values
        )
        return self.release

    def uninstall_chart(self) -> None:
        chart.uninstall(self.kubeconfig)
        self.release = None

    def checkpoint_values(self, node: RealNode | None = None) -> dict[str, Any]:
        """The chart's values for checkpoints on ``node`` (node-1 by default): the service's
        setting and the node agent's DaemonSet on this node's paths."""
        node = node or self.node
        assert node is not None and node.stack.criu_dir is not None
        return {
            "checkpoint.enabled": True,
            "checkpoint.checkpointDir": str(node.paths.kubelet_root / "checkpoints"),
            "checkpoint.containerdConfig": str(node.paths.containerd_config),
            "checkpoint.containerdAddress": str(node.paths.containerd_socket),
            # The host's mount namespace through containerd's process: on this machine root
            # may not enter PID 1's (its init holds a capability root lacks), on a node it
            # would.
            "checkpoint.hostCommand": f"nsenter --target {node.pid('containerd')} --mount --",
            "checkpoint.ctr": str(node.stack.path("ctr")),
            "checkpoint.criu": str(node.stack.criu_dir / "criu"),
            "checkpoint.pollInterval": 0.5,
        }

    def agent_daemonset(self, node: RealNode, values: Mapping[str, Any]) -> dict[str, Any]:
        """The chart's node agent DaemonSet for ``node`` alone, on its own paths (its
        :meth:`checkpoint_values`) with ``values`` over them (e.g. the registry's), for a
        real node beside node-1 whose paths differ from those the release's agent has."""
        merged = {**chart.operator_values(None), **self.checkpoint_values(node), **values}
        return chart.agent_daemonset(self.kubeconfig, node.name, merged)

    # --- access --------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def client(self) -> KubeClient:
        """The harness's raw JSON client (admin)."""
        return self.control_plane.client

    def kubelet_context(self) -> ssl.SSLContext:
        """TLS for calling node-1's kubelet as the admin: the kubelet takes client
        certificates of the control plane's CA and authorizes them by a SubjectAccessReview.
        Its serving certificate is self-signed: not verified."""
        pki_dir = self.control_plane.pki_dir
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(pki_dir / "admin.crt", pki_dir / "admin.key")
        return context

    def image(self, role: Role) -> str:
        """The reference of the imported image of ``role``: sandbox, workload or product."""
        return self.images.reference(role)

    @property
    def kubectl(self) -> Kubectl:
        """The real kubectl against this cluster (``kubectl("get", "pods", input=...)``);
        raises CalledProcessError on failure unless ``check=False``."""
        return Kubectl(self.binaries.kubectl, self.kubeconfig)

    def exec(
        self, namespace: str, pod: str, command: Sequence[str], *, container: str | None = None
    ) -> str:
        """``kubectl exec`` into a running container; its stdout (raises on failure)."""
        where = ["-c", container] if container else []
        return self.kubectl("exec", "-n", namespace, pod, *where, "--", *command).stdout

    def cpu_quota(self, namespace: str, pod: str, *, container: str | None = None) -> CpuQuota:
        """The container's CFS quota as the container itself sees it (its own cgroup)."""
        out = self.exec(namespace, pod, ["sh", "-c", CPU_QUOTA_COMMAND], container=container)
        return parse_cpu_quota(out)

    def memory(self, namespace: str, pod: str, *, container: str | None = None) -> MemoryUse:
        """The container's memory limit and usage as the container itself sees them."""
        out = self.exec(namespace, pod, ["sh", "-c", MEMORY_COMMAND], container=container)
        return parse_memory(out)

    def kill_container(self, namespace: str, pod: str) -> None:
        """SIGKILL every process of the pod's first container, as the kernel's OOM killer or
        a crash would end it: no SIGTERM, no grace period. The kubelet restarts it."""
        if self.node is None:
            raise NodeError("no real node runs")
        status = self.client.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["status"]
        container_id = str(status["containerStatuses"][0]["containerID"]).split("://", 1)[-1]
        self.node.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", container_id)

    def image_id(self, namespace: str, pod: str) -> str:
        """The first container's image as the kubelet reports it: name@sha256:digest."""
        status = self.client.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["status"]
        return str(status["containerStatuses"][0]["imageID"])

    def allocatable_millicores(self, node: str = NODE_NAME) -> int:
        cpu = self.client.get(f"/api/v1/nodes/{node}")["status"]["allocatable"]["cpu"]
        return millicores(cpu)

    def leaving(self, node: str = NODE_NAME) -> list[str]:
        """The pods bound to ``node`` that are terminating."""
        pods = self.client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]
        return [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]

    def settle(self, node: str = NODE_NAME, timeout: float = 120.0) -> None:
        """Wait until no pod bound to ``node`` is terminating. A replaced release's pods
        count on the node until they are gone: a walkthrough sized while they leave would
        fit without preempting once they have. Raises TimeoutError naming them."""
        deadline = time.monotonic() + timeout
        while leaving := self.leaving(node):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods still leaving {node} after {timeout:g}s: {leaving}")
            time.sleep(0.5)

    def requested_millicores(self, node: str = NODE_NAME) -> int:
        """CPU requested by the pods bound to ``node`` that have not finished."""
        pods = self.client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]
        return sum(
            millicores(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
            for p in pods
            if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            for c in p["spec"]["containers"]
        )

    def allocatable_memory(self, node: str = NODE_NAME) -> int:
        from harness import quantity as q

        memory = self.client.get(f"/api/v1/nodes/{node}")["status"]["allocatable"]["memory"]
        return int(q.parse(memory))

    def requested_memory(self, node: str = NODE_NAME) -> int:
        """Memory (bytes) requested by the pods bound to ``node`` that have not finished."""
        from harness import quantity as q

        pods = self.client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]
        return sum(
            int(q.parse(c.get("resources", {}).get("requests", {}).get("memory", "0")))
            for p in pods
            if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            for c in p["spec"]["containers"]
        )

    def known_pods(self) -> list[tuple[str, str]]:
        """(namespace, name) of every pod bound to a node of this cluster."""
        names = set(self.node_names)
        return [
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in self.client.get("/api/v1/pods")["items"]
            if p.get("spec", {}).get("nodeName") in names
        ]

    def create_namespace(self, name: str, timeout: float = 30.0) -> None:
        """Create a namespace and wait for its ``default`` service account (pods are refused
        until kube-controller-manager has made it)."""
        self.client.create("/api/v1/namespaces", {"metadata": {"name": name}})
        deadline = time.monotonic() + timeout
        path = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        while self.client.get_or_none(path) is None:
            if time.monotonic() > deadline:
                raise NodeError(f"namespace {name} got no default service account")
            time.sleep(0.1)


def millicores(quantity: str) -> int:
    """A CPU quantity in millicores (``"2"`` -> 2000, ``"1500m"`` -> 1500)."""
    from harness import quantity as q

    return int(q.parse(quantity) * 1000)
