"""The hollow node (``rpw-node``: the v1.37.2 kubelet without containers) on its own.

A node of this module's own, ``hollow-1`` (4 CPU, 8Gi, 20 pods, containers stop within
2 s), runs next to the session's node-1 for the length of the module, whichever node type the
rest of the suite uses. What is pinned here is the kubelet's behaviour the webhook depends
on: a pod is ready only once its container runs, a resize that fits is actuated, one that
does not is Deferred with the kubelet's message and retried when the pod in the way leaves,
victims take their grace period, and a change of allocatable reaches the kubelet's
admission.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.kubeapi import ApiError
from harness.nodes import HollowNodes, NodeOptions, NodeSpec
from tests.e2e.conftest import Cluster, Waiter, resize_events

pytestmark = pytest.mark.e2e


def gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped yet counts as exited)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


NODE = "hollow-1"
STOP_CAP = 2.0


@pytest.fixture(scope="module")
def hollow(cluster: Cluster) -> Iterator[HollowNodes]:
    nodes = HollowNodes(
        cluster.control_plane,
        [NodeSpec(NODE, cpu="4", memory="8Gi", pods=20, labels={"rpw.test/hollow": "yes"})],
        NodeOptions(stop_grace_cap=STOP_CAP),
    )
    with nodes:
        yield nodes
        assert not nodes.errors
    try:
        cluster.client.delete(f"/api/v1/nodes/{NODE}")
    except ApiError as e:
        if e.status != 404:
            raise


def make_pod(name: str, cpu: str, *, memory: str = "256Mi", grace: int = 0) -> dict[str, Any]:
    """A Guaranteed pod with one container, bound to the hollow node."""
    resources = {"cpu": cpu, "memory": memory}
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


class Pods:
    """Pods of one namespace on the hollow node, through the harness's client."""

    def __init__(self, cluster: Cluster, namespace: str, wait_until: Waiter) -> None:
        self.api = cluster.client
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.namespace = namespace
        self.wait_until = wait_until

    def get(self, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.api.get(f"{self.path}/{name}")
        return pod

    def run(self, *pods: dict[str, Any]) -> None:
        for pod in pods:
            self.api.create(self.path, pod)
        for pod in pods:
            name = pod["metadata"]["name"]
            self.wait_until(
                lambda n=name: self.get(n)["status"].get("phase") == "Running",
                what=f"{name} Running",
            )

    def resize(self, name: str, cpu: str) -> None:
        resources = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
        body = {"spec": {"containers": [{"name": "app", "resources": resources}]}}
        self.api.patch(f"{self.path}/{name}/resize", body, kind="strategic")

    def actual_cpu(self, name: str) -> str | None:
        statuses = self.get(name)["status"].get("containerStatuses") or [{}]
        cpu: str | None = (statuses[0].get("resources") or {}).get("requests", {}).get("cpu")
        return cpu

    def resize_conditions(self, name: str) -> dict[str, dict[str, Any]]:
        conditions = self.get(name)["status"].get("conditions") or []
        return {c["type"]: c for c in conditions if c["type"].startswith("PodResize")}

    def events(self, name: str) -> list[tuple[str, str]]:
        items = self.api.get(
            f"/api/v1/namespaces/{self.namespace}/events",
            fieldSelector=f"involvedObject.name={name}",
        )["items"]
        return [(e["reason"], e["message"]) for e in items]


@pytest.fixture
def pods(hollow: HollowNodes, cluster: Cluster, namespace: str, wait_until: Waiter) -> Pods:
    return Pods(cluster, namespace, wait_until)


def test_a_node_starts_ready_untainted_with_the_requested_size(
    hollow: HollowNodes, cluster: Cluster
) -> None:
    node = cluster.client.get(f"/api/v1/nodes/{NODE}")
    status = node["status"]
    assert {"cpu": "4", "memory": "8Gi", "pods": "20"} == {
        k: status["capacity"][k] for k in ("cpu", "memory", "pods")
    }
    assert {"cpu": "4", "memory": "8Gi", "pods": "20"} == {
        k: status["allocatable"][k] for k in ("cpu", "memory", "pods")
    }
    assert cluster.binaries.version == status["nodeInfo"]["kubeletVersion"]
    assert [] == [t for t in node["spec"].get("taints") or []]
    assert "yes" == node["metadata"]["labels"]["rpw.test/hollow"]
    ready = {c["type"]: c["status"] for c in status["conditions"]}["Ready"]
    assert "True" == ready
    assert cluster.client.get_or_none(f"/apis/storage.k8s.io/v1/csinodes/{NODE}") is not None


def test_a_pod_is_ready_only_once_its_container_runs(pods: Pods) -> None:
    """Every status the kubelet writes for a new pod, in order, until it says Ready.

    The prober manager calls a container without probes started and ready once it runs. A
    pod called Ready while still Pending counts as healthy for its PodDisruptionBudget, yet
    the Eviction API lets a Pending pod go whatever the budget says.
    """
    listed = pods.api.get(pods.path)["metadata"]["resourceVersion"]
    pods.api.create(pods.path, make_pod("prober", "1"))
    seen: list[tuple[str, str, str, str, bool, bool]] = []
    for event in pods.api.watch(pods.path, listed, timeout_seconds=30):
        status = event["object"].get("status") or {}
        if event["type"] == "BOOKMARK" or not status.get("containerStatuses"):
            continue
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        container = status["containerStatuses"][0]
        state = next(iter(container.get("state") or {}), "none")
        started, ready = bool(container.get("started")), bool(container["ready"])
        ready_conditions = (conditions["Ready"], conditions["ContainersReady"])
        seen.append((status["phase"], *ready_conditions, state, started, ready))
        if conditions["Ready"] == "True":
            break

    assert seen, "the kubelet wrote no status with its container within 30 s"
    assert ("Running", "True", "True", "running", True, True) == seen[-1], seen
    assert [] == [s for s in seen if "True" in s[1:3] and s[:4] != seen[-1][:4]], seen
    assert [] == [s for s in seen if (s[3] == "running") != s[4] or s[4] != s[5]], seen


def test_a_resize_that_fits_is_actuated_with_the_kubelets_events(
    pods: Pods, cluster: Cluster, wait_until: Waiter
) -> None:
    pods.run(make_pod("grower", "1"))

    pods.resize("grower", "2")

    wait_until(lambda: pods.actual_cpu("grower") == "2", what="grower actuated at 2 CPU")
    assert {} == pods.resize_conditions("grower")
    allocated = pods.get("grower")["status"]["containerStatuses"][0]["allocatedResources"]
    assert "2" == allocated["cpu"]
    expected = resize_events(cluster.binaries)
    if expected:
        reasons = wait_until(
            lambda: (
                (r := {reason for reason, _ in pods.events("grower")}) >= {"ResizeCompleted"} and r
            ),
            what="ResizeCompleted event",
        )
        assert expected <= reasons
    else:
        assert set() == {r for r, _ in pods.events("grower") if r.startswith("Resize")}


def test_a_resize_that_does_not_fit_is_deferred_then_actuated_when_the_pod_in_the_way_leaves(
    pods: Pods, cluster: Cluster, wait_until: Waiter
) -> None:
    pods.run(make_pod("grower", "3"), make_pod("in-the-way", "1"))

    pods.resize("grower", "4")

    pending = wait_until(
        lambda: pods.resize_conditions("grower").get("PodResizePending"),
        what="PodResizePending on grower",
    )
    assert "Deferred" == pending["reason"]
    assert (
        "Node didn't have enough resource: cpu, requested: 4000, used: 1000, capacity: 4000"
        == pending["message"]
    )
    minor = cluster.binaries.kube_version[1]
    if minor >= 35:  # no ResizeDeferred event before 1.35
        deferred = wait_until(
            lambda: [m for reason, m in pods.events("grower") if reason == "ResizeDeferred"],
            what="ResizeDeferred event",
        )
        # 1.35 names the condition's reason, 1.36 and later the admit reason.
        prefix = "Pod resize OutOfcpu: " if minor >= 36 else "Pod resize Deferred: "
        assert deferred[0].startswith(prefix)
    assert "3" == pods.actual_cpu("grower")

    cluster.client.delete(f"{pods.path}/in-the-way")

    # Before 1.34 a pod's removal does not retry the others' pending resizes: the kubelet
    # decides again at grower's next sync (syncFrequency 10 s here, plus up to 50% jitter).
    retry = 10.0 if cluster.binaries.kube_version[1] >= 34 else 25.0
    wait_until(
        lambda: pods.actual_cpu("grower") == "4", timeout=retry, what="grower actuated at 4 CPU"
    )
    assert {} == pods.resize_conditions("grower")


def test_a_deleted_pod_takes_its_grace_period_up_to_the_cap(
    pods: Pods, cluster: Cluster, wait_until: Waiter
) -> None:
    pods.run(make_pod("quick", "1", grace=0), make_pod("slow", "1", grace=30))

    began = time.monotonic()
    cluster.client.delete(f"{pods.path}/quick")
    wait_until(lambda: cluster.client.get_or_none(f"{pods.path}/quick") is None, what="quick gone")
    quick = time.monotonic() - began
    began = time.monotonic()
    cluster.client.delete(f"{pods.path}/slow")
    wait_until(
        lambda: cluster.client.get_or_none(f"{pods.path}/slow") is None,
        timeout=15,
        what="slow gone",
    )
    slow = time.monotonic() - began

    assert quick < STOP_CAP
    assert STOP_CAP <= slow < STOP_CAP + 5


def test_a_change_of_allocatable_reaches_the_kubelets_admission(
    pods: Pods, hollow: HollowNodes, cluster: Cluster, wait_until: Waiter
) -> None:
    pods.run(make_pod("grower", "1"), make_pod("neighbour", "1"))
    hollow.set_allocatable(NODE, cpu="3", memory="4Gi")
    try:
        allocatable = cluster.client.get(f"/api/v1/nodes/{NODE}")["status"]["allocatable"]
        assert ("3", "4Gi") == (allocatable["cpu"], allocatable["memory"])

        pods.resize("grower", "2500m")

        pending = wait_until(
            lambda: pods.resize_conditions("grower").get("PodResizePending"),
            what="PodResizePending on grower",
        )
        assert (
            "Node didn't have enough resource: cpu, requested: 2500, used: 1000, capacity: 3000"
            == pending["message"]
        )
    finally:
        hollow.set_allocatable(NODE)

    # A new resize makes the kubelet decide again, now against the whole node.
    pods.resize("grower", "2600m")

    wait_until(lambda: pods.actual_cpu("grower") == "2600m", what="grower actuated at 2.6 CPU")


def test_a_kubelet_dies_with_the_process_that_started_it(cluster: Cluster, tmp_path: Path) -> None:
    """SIGKILL of the harness leaves no kubelet behind (its parent-death signal)."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from harness.processes import spawn\n"
        "p = spawn('kubelet', sys.argv[1:], Path(sys.argv[0]).parent / 'kubelet.log')\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    (tmp_path / "parent.py").write_text(script)
    argv = [
        str(cluster.binaries.rpw_node),
        f"--kubeconfig={cluster.kubeconfig}",
        "--name=orphan-check",
        f"--root-dir={tmp_path / 'root'}",
    ]
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py"), *argv],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert parent.stdout is not None
        kubelet_pid = int(parent.stdout.readline())
        assert not gone(kubelet_pid, 1.0), "the kubelet should run while its parent does"

        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(5)

        assert gone(kubelet_pid, 10.0)
    finally:
        if parent.poll() is None:
            parent.kill()
        try:
            cluster.client.delete("/api/v1/nodes/orphan-check")
        except ApiError as e:
            if e.status != 404:
                raise


def test_the_node_binary_reports_the_control_planes_version(cluster: Cluster) -> None:
    out = subprocess.run(
        [str(cluster.binaries.rpw_node), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"Kubernetes {cluster.binaries.version}" == out.strip()
