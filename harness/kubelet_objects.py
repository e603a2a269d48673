"""The API objects a v1.37 kubelet writes, built as plain dicts: Node, Lease, pod status, Event.

Pure functions (no I/O) used by the node emulator; the field choices follow
``pkg/kubelet/kubelet_pods.go`` (``generateAPIPodStatus``) and ``pkg/kubelet/nodestatus`` so
``kubectl get/describe`` print emulated objects like real ones.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import kubelet_model as km
from harness import quantity

KUBELET_VERSION = "v1.37.2"
# Features a default-configured 1.37 kubelet declares (NodeDeclaredFeatures, GA in 1.37);
# the NodeDeclaredFeatureValidator admission plugin checks pod updates against them.
DECLARED_FEATURES = (
    "InPlacePodLevelResourcesVerticalScaling",
    "InPlacePodVerticalScalingInitContainers",
)
# Kubelet-owned conditions a running pod carries, in the kubelet's order.
RUNNING_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One emulated node: its name, allocatable resources and extra metadata."""

    name: str
    cpu: str = "8"
    memory: str = "16Gi"
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def now() -> str:
    """The current time in the API's second-precision format."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """An API timestamp as a POSIX time."""
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def semantic_equal(a: Any, b: Any) -> bool:
    """Deep equality where quantity strings compare by value ("1000m" == "1").

    The API server re-serializes quantities canonically; comparing by value keeps the
    emulator from rewriting a status that only differs in spelling.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(semantic_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(semantic_equal(x, y) for x, y in zip(a, b, strict=True))
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str):
        try:
            return quantity.parse(a) == quantity.parse(b)
        except ValueError:
            return False
    return False


def host_ip(index: int) -> str:
    """The InternalIP of the node with this index."""
    return f"172.18.0.{index + 2}"


def pod_ip(node_index: int, sequence: int) -> str:
    """The ``sequence``-th pod IP handed out on a node (from its /24 pod CIDR)."""
    return f"10.244.{node_index}.{sequence % 253 + 2}"


def node_object(spec: NodeSpec, index: int) -> dict[str, Any]:
    """A Ready node, as a kubelet registers it (status included: allowed on create)."""
    allocatable = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": str(spec.pods),
        "ephemeral-storage": "100Gi",
    }
    stamp = now()

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }

    def digest(salt: str) -> str:
        return hashlib.sha256(f"{spec.name}/{salt}".encode()).hexdigest()[:32]

    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": spec.name,
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                **spec.labels,
            },
            "annotations": dict(spec.annotations),
        },
        "spec": {"podCIDR": f"10.244.{index}.0/24", "podCIDRs": [f"10.244.{index}.0/24"]},
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": host_ip(index)},
                {"type": "Hostname", "address": spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "declaredFeatures": list(DECLARED_FEATURES),
            "nodeInfo": {
                "machineID": digest("machine"),
                "systemUUID": digest("uuid"),
                "bootID": digest("boot"),
                "kernelVersion": "6.1.0",
                "osImage": "Node emulator (resize-preemption-webhook tests)",
                "containerRuntimeVersion": "containerd://2.1.0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def lease_object(node: Mapping[str, Any]) -> dict[str, Any]:
    """The node's heartbeat Lease in kube-node-lease, owned by the Node."""
    name = node["metadata"]["name"]
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [owner]},
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


def running_status(
    pod: Mapping[str, Any],
    allocation: km.PodAllocation,
    *,
    node_ip: str,
    ip: str,
    resize_conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The status a kubelet reports for a running pod whose resources are ``allocation``.

    Keeps conditions the kubelet does not own (DisruptionTarget, readiness gates...), the
    start times already reported and ``qosClass``; ``resize_conditions`` are the kubelet's
    cached PodResizePending (and similar) conditions, written verbatim.
    """
    old = pod.get("status", {})
    generation = int(pod["metadata"].get("generation") or 0)
    stamp = now()
    started = old.get("startTime") or stamp
    previous = {c["type"]: c for c in old.get("conditions") or []}

    def kubelet_condition(kind: str) -> dict[str, Any]:
        before = previous.get(kind)
        kept = before is not None and before.get("status") == "True"
        return {
            "type": kind,
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": before["lastTransitionTime"] if kept and before else stamp,
            "observedGeneration": generation,
        }

    owned = km.KUBELET_CONDITIONS | {km.PREEMPTION_DISABLED}
    conditions = [c for c in old.get("conditions") or [] if c["type"] not in owned]
    conditions += [dict(c) for c in resize_conditions]
    conditions += [kubelet_condition(kind) for kind in RUNNING_CONDITIONS]
    init_statuses, app_statuses = container_statuses(pod, allocation, started)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": "Running",
        "conditions": conditions,
        "hostIP": node_ip,
        "hostIPs": [{"ip": node_ip}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": started,
        "containerStatuses": app_statuses,
        "qosClass": old.get("qosClass"),
    }
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    status.update(pod_level_resources(km.with_allocation(pod, allocation)))
    for key in ("nominatedNodeName", "resourceClaimStatuses", "extendedResourceClaimStatus"):
        if key in old:
            status[key] = old[key]
    return {k: v for k, v in status.items() if v is not None}


def pod_level_resources(allocated: Mapping[str, Any]) -> dict[str, Any]:
    """``status.allocatedResources`` and ``status.resources`` of the whole pod.

    1.37 kubelets report them (InPlacePodLevelResourcesVerticalScaling is on by default):
    the effective requests of the allocated pod, and its limits, as cgroups would read back
    without rounding.
    """
    names: set[str] = set()
    for c in km.containers(allocated):
        names |= set((c.get("resources") or {}).get("requests") or {})
    names |= set((allocated["spec"].get("resources") or {}).get("requests") or {})
    names |= set(allocated["spec"].get("overhead") or {})
    requested = km.requests_list(km.pod_requests(allocated))
    requests = {k: v for k, v in requested.items() if k in names}
    resources: dict[str, Any] = {}
    if limits := km.pod_limits(allocated):
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    out: dict[str, Any] = {"resources": resources}
    if requests:
        out["allocatedResources"] = requests
    return out


def container_statuses(
    pod: Mapping[str, Any], allocation: km.PodAllocation, started: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(initContainerStatuses, containerStatuses): sidecars and app containers running,
    regular init containers completed; ``allocatedResources``/``resources`` from the
    allocation."""
    status = pod.get("status", {})
    old = {
        cs["name"]: cs
        for cs in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
    }
    uid = pod["metadata"]["uid"]

    def one(c: Mapping[str, Any], init: bool) -> dict[str, Any]:
        name = c["name"]
        previous = old.get(name, {})
        state = previous.get("state", {})
        since = (
            (state.get("running") or {}).get("startedAt")
            or (state.get("terminated") or {}).get("startedAt")
            or started
        )
        container_id = "containerd://" + hashlib.sha256(f"{uid}/{name}".encode()).hexdigest()
        image = normalize_image(c.get("image", ""))
        alloc = allocation.containers.get(name, km.ContainerAllocation({}, {}))
        resources: dict[str, Any] = {}
        if alloc.limits:
            resources["limits"] = dict(alloc.limits)
        if alloc.requests:
            resources["requests"] = dict(alloc.requests)
        result: dict[str, Any] = {
            "name": name,
            "state": {"running": {"startedAt": since}},
            "lastState": {},
            "ready": True,
            "restartCount": int(previous.get("restartCount") or 0),
            "image": image,
            "imageID": image_id(image),
            "containerID": container_id,
            "started": True,
            "resources": resources,
        }
        if alloc.requests:
            result["allocatedResources"] = dict(alloc.requests)
        if init and not km.is_sidecar(c):
            result["state"] = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": since,
                    "finishedAt": since,
                    "containerID": container_id,
                }
            }
            result["started"] = False
        return result

    spec = pod["spec"]
    return (
        [one(c, True) for c in spec.get("initContainers") or []],
        [one(c, False) for c in spec.get("containers") or []],
    )


def rejected_status(pod: Mapping[str, Any], decision: km.Decision) -> dict[str, Any]:
    """``kl.rejectPod``: phase Failed with the admit reason and message."""
    status = pod.get("status", {})
    return {
        "phase": "Failed",
        "reason": decision.reason,
        "message": "Pod was rejected: " + decision.message,
        "qosClass": status.get("qosClass"),
        "conditions": status.get("conditions", []),
    }


def preemption_disabled_condition(node: str, owners: Sequence[str]) -> dict[str, Any]:
    """``PodResizePreemptionDisabled=True`` (a KEP-5836 alternative, not in v1.37.2)."""
    return {
        "type": km.PREEMPTION_DISABLED,
        "status": "True",
        "lastProbeTime": None,
        "lastTransitionTime": now(),
        "reason": "NodeDisablesResizePreemption",
        "message": f"resize preemption is disabled on node {node} by: {', '.join(owners)}",
    }


def event_object(pod: Mapping[str, Any], kind: str, reason: str, message: str) -> dict[str, Any]:
    """A core/v1 Event as the kubelet's event recorder writes it about ``pod``."""
    meta = pod["metadata"]
    node = pod["spec"]["nodeName"]
    stamp = now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": node},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "type": kind,
        "eventTime": None,
        "reportingComponent": "kubelet",
        "reportingInstance": node,
    }


def normalize_image(image: str) -> str:
    """The image name containerd reports: registry and tag spelled out."""
    if not image:
        return image
    name, _, digest = image.partition("@")
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    if not digest and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


def image_id(image: str) -> str:
    """A stable repo digest for an image name (there is no registry to ask)."""
    repository = image.split("@", 1)[0].rsplit(":", 1)[0]
    return f"{repository}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
