"""Hollow nodes: the upstream kubelet, one process per node, without containers.

Each node is an ``rpw-node`` process (``harness/node``, built with the control plane from
the same k8s.io/kubernetes version): the kubelet's own code registers the Node, admits pods,
defers and retries resizes, actuates them and terminates pods; a fake CRI runtime, a fake
cadvisor and in-memory pod cgroups stand in for containers and the machine.

What the harness adds around the processes:

* the not-ready taint that the ``TaintNodesByCondition`` admission plugin puts on every new
  Node is lifted once the kubelet reports Ready (only the disruption controller runs, so no
  node-lifecycle controller would do it);
* start waits until the node is Ready, untainted and has its CSINode (the kubelet exits when
  it cannot create it within about 140 s, so a node that gets there stays);
* labels and annotations of a :class:`NodeSpec` are patched onto the Node (the kubelet keeps
  what it did not set itself);
* a node's allocatable can be changed while it runs (:meth:`HollowNodes.set_allocatable`):
  the kubelet re-reads its reservation file at every status sync.

Every process is started through :func:`harness.processes.spawn`: it dies with the harness,
also when the harness is killed with SIGKILL.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from harness import quantity
from harness.kubeapi import ApiError, KubeClient
from harness.launcher import ControlPlane
from harness.processes import ManagedProcess, spawn

NOT_READY_TAINT = "node.kubernetes.io/not-ready"

__all__ = [
    "HollowNodes",
    "NodeError",
    "NodeOptions",
    "NodeSpec",
    "default_nodes",
    "wait_node_ready",
]


class NodeError(RuntimeError):
    """A node did not start or its kubelet died; the message carries the tail of its log."""


@dataclass(frozen=True)
class NodeSpec:
    """One node: its name, size (whole cores), pod capacity and extra metadata.

    Allocatable starts equal to the size (no system reservation, no eviction threshold).
    """

    name: str
    cpu: str = "8"
    memory: str = "16Gi"
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeOptions:
    """How the kubelets run.

    ``stop_grace_cap``: seconds a container takes to stop at most; None gives each victim its
    whole grace period, as a process that ignores SIGTERM would take (fast tests cap it).
    ``feature_gates``: the kubelets' feature gates (the control plane has its own), less
    those the binaries' version does not know.
    ``status_update_frequency``: seconds between the kubelet's Node status syncs; a change of
    allocatable shows within about this long.
    """

    stop_grace_cap: float | None = None
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    status_update_frequency: float = 1.0
    ready_timeout: float = 90.0
    verbosity: int = 1


def default_nodes(
    count: int = 1, cpu: str = "8", memory: str = "16Gi", pods: int = 110
) -> list[NodeSpec]:
    """``node-1`` .. ``node-N``, all the same size."""
    return [NodeSpec(f"node-{i}", cpu, memory, pods) for i in range(1, count + 1)]


@dataclass
class _Node:
    spec: NodeSpec
    directory: Path
    process: ManagedProcess
    stopping: bool = False

    @property
    def reservation_file(self) -> Path:
        return self.directory / "reserved"


class HollowNodes:
    """The kubelets of a control plane; use as a context manager or start()/stop()."""

    def __init__(
        self,
        control_plane: ControlPlane,
        nodes: Sequence[NodeSpec],
        options: NodeOptions | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.options = options or NodeOptions()
        self._specs = list(nodes)
        self._nodes: dict[str, _Node] = {}
        self.started_in: float | None = None

    def __enter__(self) -> HollowNodes:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def names(self) -> list[str]:
        return list(self._nodes)

    def start(self) -> HollowNodes:
        """Start every node and wait until all are Ready; stops them all on failure."""
        began = time.monotonic()
        try:
            for spec in self._specs:
                self._spawn(spec)
            for spec in self._specs:
                self._wait_ready(self._nodes[spec.name])
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop every kubelet (their Node objects stay, as when kubelets stop); idempotent."""
        for node in self._nodes.values():
            node.stopping = True
        for node in list(self._nodes.values()):
            node.process.stop()
            shutil.rmtree(node.directory, ignore_errors=True)
        self._nodes.clear()

    def add_node(self, spec: NodeSpec) -> None:
        """Start one more node and wait until it is Ready."""
        if spec.name in self._nodes:
            raise ValueError(f"node {spec.name} runs already")
        node = self._spawn(spec)
        try:
            self._wait_ready(node)
        except BaseException:
            self.remove_node(spec.name)
            raise

    def remove_node(self, name: str) -> None:
        """Stop a node's kubelet and delete its Node object."""
        node = self._nodes.pop(name)
        node.stopping = True
        node.process.stop()
        shutil.rmtree(node.directory, ignore_errors=True)
        try:
            self.control_plane.client.delete(f"/api/v1/nodes/{name}")
        except ApiError as e:
            if e.status != 404:
                raise

    @property
    def errors(self) -> list[str]:
        """One line per kubelet that exited without being stopped."""
        return [
            f"{name}: kubelet exited with {node.process.popen.returncode}"
            for name, node in self._nodes.items()
            if not node.stopping and not node.process.running()
        ]

    def check_alive(self) -> None:
        for name, node in self._nodes.items():
            if not node.stopping and not node.process.running():
                raise NodeError(
                    f"kubelet of {name} exited with {node.process.popen.returncode}:\n"
                    f"{node.process.log_tail()}"
                )

    def pid(self, name: str) -> int:
        return self._nodes[name].process.pid

    def log_path(self, name: str) -> Path:
        return self._nodes[name].process.log_path

    def known_pods(self) -> list[tuple[str, str]]:
        """(namespace, name) of every pod bound to one of these nodes, as the API has them.

        The kubelet deletes a terminated pod's object itself, so a pod is gone from this list
        once its node has finished with it.
        """
        names = set(self._nodes)
        pods = self.control_plane.client.get("/api/v1/pods")["items"]
        return [
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in pods
            if p.get("spec", {}).get("nodeName") in names
        ]

    def pending_resizes(self, node: str) -> list[str]:
        """Names of the pods on ``node`` whose resize the kubelet holds (PodResizePending)."""
        pods = self.control_plane.client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")[
            "items"
        ]
        return sorted(
            p["metadata"]["name"]
            for p in pods
            if any(
                c.get("type") == "PodResizePending" and c.get("status") == "True"
                for c in p.get("status", {}).get("conditions") or []
            )
        )

    def set_allocatable(
        self,
        name: str,
        *,
        cpu: str | None = None,
        memory: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        """Make the node's allocatable ``cpu``/``memory`` (None: its full size again) and wait
        until the Node object shows it. The rest of the node is reserved, as by
        ``--system-reserved``; the kubelet admits and retries against the new figure."""
        node = self._nodes[name]
        lines: list[str] = []
        wanted: dict[str, Fraction] = {}
        for resource, size, value in (
            ("cpu", node.spec.cpu, cpu),
            ("memory", node.spec.memory, memory),
        ):
            target = quantity.parse(value if value is not None else size)
            reserved = quantity.parse(size) - target
            if reserved < 0:
                raise ValueError(f"{resource} {value} is more than the size of {name} ({size})")
            wanted[resource] = target
            if reserved and resource == "cpu":
                lines.append(f"cpu={int(reserved * 1000)}m")
            elif reserved:
                lines.append(f"memory={int(reserved)}")
        tmp = node.reservation_file.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(node.reservation_file)
        deadline = time.monotonic() + timeout
        while True:
            allocatable = self._node_object(name).get("status", {}).get("allocatable", {})
            if all(quantity.parse(allocatable.get(r, "0")) == v for r, v in wanted.items()):
                return
            self.check_alive()
            if time.monotonic() > deadline:
                raise NodeError(f"{name} did not report allocatable {wanted} within {timeout} s")
            time.sleep(0.1)

    # --- steps ----------------------------------------------------------------------------

    def _spawn(self, spec: NodeSpec) -> _Node:
        binary = self.control_plane.binaries.rpw_node
        if not binary.exists():
            raise NodeError(f"{binary} is missing: run scripts/build-control-plane.sh")
        # The kubelet opens unix sockets under its root directory (CRI, pod resources, pods
        # API), and a socket address holds 107 bytes: a short directory of its own, linked
        # from the state directory for post-mortems, whatever the node's name and the
        # state directory's depth.
        directory = Path(tempfile.mkdtemp(prefix="rpw-node-"))
        link = self.control_plane.state_dir / "nodes" / spec.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(directory)
        options = self.options
        argv = [
            str(binary),
            f"--kubeconfig={self.control_plane.kubeconfig}",
            f"--name={spec.name}",
            f"--root-dir={directory / 'kubelet'}",
            f"--cpu={spec.cpu}",
            f"--memory={spec.memory}",
            f"--max-pods={spec.pods}",
            f"--reservation-file={directory / 'reserved'}",
            f"--node-status-update-frequency={options.status_update_frequency}s",
            f"--v={options.verbosity}",
        ]
        if options.stop_grace_cap is not None:
            argv.append(f"--stop-grace-cap={options.stop_grace_cap}s")
        gates = (
            self.control_plane.binaries.settable(options.feature_gates)
            if options.feature_gates
            else {}
        )
        if gates:
            text = ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())
            argv.append(f"--feature-gates={text}")
        log = self.control_plane.log_dir / f"kubelet-{spec.name}.log"
        node = _Node(spec, directory, spawn(f"kubelet-{spec.name}", argv, log))
        self._nodes[spec.name] = node
        return node

    def _node_object(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.control_plane.client.get_or_none(f"/api/v1/nodes/{name}") or {}
        return node

    def _wait_ready(self, node: _Node) -> None:
        wait_node_ready(
            self.control_plane.client,
            node.spec,
            timeout=self.options.ready_timeout,
            check_alive=self.check_alive,
            log_tail=node.process.log_tail,
        )


def wait_node_ready(
    client: KubeClient,
    spec: NodeSpec,
    *,
    timeout: float,
    check_alive: Callable[[], None],
    log_tail: Callable[[], str],
) -> None:
    """Wait until the kubelet of ``spec`` has registered its Node Ready; then lift the
    not-ready taint and patch the spec's labels and annotations on, and wait for its
    CSINode. ``check_alive`` raises when the kubelet died; ``log_tail`` goes into the error
    when the node is not there within ``timeout`` seconds. Hollow and real nodes alike."""
    name = spec.name
    deadline = time.monotonic() + timeout
    patched = False
    while True:
        check_alive()
        obj: dict[str, Any] = client.get_or_none(f"/api/v1/nodes/{name}") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in obj.get("status", {}).get("conditions") or []
        )
        if ready and not patched:
            taints = [t for t in obj["spec"].get("taints") or [] if t["key"] != NOT_READY_TAINT]
            metadata: dict[str, Any] = {}
            if spec.labels:
                metadata["labels"] = dict(spec.labels)
            if spec.annotations:
                metadata["annotations"] = dict(spec.annotations)
            body: dict[str, Any] = {"spec": {"taints": taints or None}}
            if metadata:
                body["metadata"] = metadata
            client.patch(f"/api/v1/nodes/{name}", body)
            patched = True
            continue
        if patched and client.get_or_none(f"/apis/storage.k8s.io/v1/csinodes/{name}"):
            return
        if time.monotonic() > deadline:
            raise NodeError(f"{name} not ready after {timeout:.0f} s:\n{log_tail()}")
        time.sleep(0.1)
