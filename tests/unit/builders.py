"""Builders for the objects the decision core reads.

Pods, nodes, budgets and priority classes are written as the Kubernetes objects
``kubectl get -o yaml`` prints and go through the real parsers in
:mod:`webhook.core.objects`, so every test exercises parsing as well::

    low = make_pod("low").priority(LOW).requests(cpu="3").on("node-1").started(100).build()
    old, new = make_pod("high").priority(HIGH).requests(cpu="4").started(50).resize(cpu="6")
    node = make_node("node-1").allocatable(cpu="8", memory="16Gi").build()
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from webhook.core.accounting import Reservation
from webhook.core.model import FLOOR_ANNOTATION, DisruptionBudget, Node, Pod, PriorityClass
from webhook.core.objects import (
    PriorityResolver,
    parse_node,
    parse_pdb,
    parse_pod,
    parse_priority_class,
)
from webhook.core.plan import NodePods, Plan, plan_resize
from webhook.core.policy import DefaultPolicy, PreemptionPolicy
from webhook.core.resize import apply_resize
from webhook.core.resources import Resources

# Named priority tiers.
ZERO_PRIORITY = 0
LOW = 1000
MID = 5000
HIGH = 1_000_000

#: Epoch seconds all builder times are relative to, and the planner's clock.
T0 = 1_700_000_000.0
NOW = T0 + 10_000.0

NODE = "node-1"
OTHER_NODE = "node-2"

Mi = 2**20
Gi = 2**30


_NO_CLASSES = PriorityResolver()


def rfc3339(epoch: float) -> str:
    """Epoch seconds -> the RFC 3339 form the API server writes."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resource_list(cpu: object = None, memory: object = None) -> dict[str, object]:
    """A ``ResourceList`` holding only the quantities given."""
    out: dict[str, object] = {}
    if cpu is not None:
        out["cpu"] = cpu
    if memory is not None:
        out["memory"] = memory
    return out


def cores(n: float) -> int:
    """Millicores in ``n`` cores, to compare with parsed amounts."""
    return round(n * 1000)


class PodBuilder:
    """A Pod object under construction; :meth:`build` parses it into a model ``Pod``."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {"nodeName": NODE, "containers": []},
            "status": {"phase": "Running", "qosClass": "Burstable"},
        }
        self._admitted = False

    # -- identity and placement -------------------------------------------------------
    def namespace(self, namespace: str) -> PodBuilder:
        meta = self._obj["metadata"]
        meta["namespace"] = namespace
        meta["uid"] = f"uid-{namespace}-{meta['name']}"
        return self

    def uid(self, uid: str | None) -> PodBuilder:
        if uid is None:
            self._obj["metadata"].pop("uid", None)
        else:
            self._obj["metadata"]["uid"] = uid
        return self

    def version(self, resource_version: str) -> PodBuilder:
        """``metadata.resourceVersion``, as the API server stamps each stored version."""
        self._obj["metadata"]["resourceVersion"] = resource_version
        return self

    def on(self, node: str) -> PodBuilder:
        self._obj["spec"]["nodeName"] = node
        return self

    def unbound(self) -> PodBuilder:
        self._obj["spec"].pop("nodeName", None)
        self._obj["status"]["phase"] = "Pending"
        return self

    def labels(self, **labels: str) -> PodBuilder:
        self._obj["metadata"].setdefault("labels", {}).update(labels)
        return self

    def annotate(self, key: str, value: str) -> PodBuilder:
        self._obj["metadata"].setdefault("annotations", {})[key] = value
        return self

    def mirror(self) -> PodBuilder:
        return self.annotate("kubernetes.io/config.mirror", "hash")

    def owned_by(self, kind: str, name: str = "owner", *, controller: bool = True) -> PodBuilder:
        """An owner reference (``controller: true`` unless told otherwise)."""
        ref = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{name}"}
        if controller:
            ref["controller"] = True
        self._obj["metadata"].setdefault("ownerReferences", []).append(ref)
        return self

    def spec_field(self, field: str, value: Any) -> PodBuilder:
        """Any other field of the spec, as the API takes it (``nodeSelector``,
        ``affinity``, ``tolerations``, ``volumes``...)."""
        self._obj["spec"][field] = value
        return self

    def tolerates(self, key: str, effect: str = "", value: str | None = None) -> PodBuilder:
        toleration: dict[str, str] = {"key": key}
        if value is None:
            toleration["operator"] = "Exists"
        else:
            toleration.update(operator="Equal", value=value)
        if effect:
            toleration["effect"] = effect
        self._obj["spec"].setdefault("tolerations", []).append(toleration)
        return self

    def terminating(self, at: float = 5.0) -> PodBuilder:
        self._obj["metadata"]["deletionTimestamp"] = rfc3339(T0 + at)
        return self

    def phase(self, phase: str) -> PodBuilder:
        self._obj["status"]["phase"] = phase
        return self

    # -- priority -----------------------------------------------------------------------
    def priority(self, value: int | None) -> PodBuilder:
        if value is None:
            self._obj["spec"].pop("priority", None)
        else:
            self._obj["spec"]["priority"] = value
        return self

    def priority_class(self, name: str) -> PodBuilder:
        self._obj["spec"]["priorityClassName"] = name
        return self

    def preemption_policy(self, policy: str) -> PodBuilder:
        self._obj["spec"]["preemptionPolicy"] = policy
        return self

    def never_preempts(self) -> PodBuilder:
        return self.preemption_policy("Never")

    # -- time ---------------------------------------------------------------------------
    def started(self, at: float) -> PodBuilder:
        """``status.startTime`` ``at`` seconds after :data:`T0`."""
        self._obj["status"]["startTime"] = rfc3339(T0 + at)
        return self

    def not_started(self) -> PodBuilder:
        self._obj["status"].pop("startTime", None)
        return self

    # -- resources ----------------------------------------------------------------------
    def _container(self, field: str, name: str) -> dict[str, Any]:
        containers = self._obj["spec"].setdefault(field, [])
        for c in containers:
            if c["name"] == name:
                return c  # type: ignore[no-any-return]
        c = {"name": name, "image": "registry.k8s.io/pause:3.10"}
        containers.append(c)
        return c

    def requests(
        self, cpu: object = None, memory: object = None, *, container: str = "app"
    ) -> PodBuilder:
        c = self._container("containers", container)
        c.setdefault("resources", {})["requests"] = resource_list(cpu, memory)
        return self

    def limits(
        self, cpu: object = None, memory: object = None, *, container: str = "app"
    ) -> PodBuilder:
        c = self._container("containers", container)
        c.setdefault("resources", {})["limits"] = resource_list(cpu, memory)
        return self

    def init_container(
        self, name: str, cpu: object = None, memory: object = None, *, sidecar: bool = False
    ) -> PodBuilder:
        c = self._container("initContainers", name)
        c["resources"] = {"requests": resource_list(cpu, memory)}
        if sidecar:
            c["restartPolicy"] = "Always"
        return self

    def sidecar(self, name: str, cpu: object = None, memory: object = None) -> PodBuilder:
        return self.init_container(name, cpu, memory, sidecar=True)

    def floor(
        self, cpu: object = None, memory: object = None, *, container: str = "app"
    ) -> PodBuilder:
        """Add ``container``'s floor to the pod's floor annotation (lending opt-in)."""
        meta = self._obj["metadata"]
        floors = json.loads(meta.get("annotations", {}).get(FLOOR_ANNOTATION, "{}"))
        floors[container] = resource_list(cpu, memory)
        return self.annotate(FLOOR_ANNOTATION, json.dumps(floors))

    def resize_policy(
        self, resource: str, policy: str = "RestartContainer", *, container: str = "app"
    ) -> PodBuilder:
        c = self._container("containers", container)
        c.setdefault("resizePolicy", []).append({"resourceName": resource, "restartPolicy": policy})
        return self

    def qos(self, qos_class: str) -> PodBuilder:
        """``status.qosClass`` as the kubelet reports it (the builder's default is
        Burstable); ``Guaranteed`` also sets every container's limits to its requests."""
        self._obj["status"]["qosClass"] = qos_class
        if qos_class == "Guaranteed":
            for field in ("initContainers", "containers"):
                for c in self._obj["spec"].get(field, []):
                    resources = c.setdefault("resources", {})
                    resources["limits"] = dict(resources.get("requests", {}))
        return self

    def overhead(self, cpu: object = None, memory: object = None) -> PodBuilder:
        self._obj["spec"]["overhead"] = resource_list(cpu, memory)
        return self

    def pod_resources(self, cpu: object = None, memory: object = None) -> PodBuilder:
        """Pod-level ``spec.resources.requests``."""
        self._obj["spec"]["resources"] = {"requests": resource_list(cpu, memory)}
        return self

    def pod_status_resources(
        self, allocated: Resources | None = None, actual: Resources | None = None
    ) -> PodBuilder:
        status = self._obj["status"]
        if allocated is not None:
            status["allocatedResources"] = {
                "cpu": f"{allocated.cpu}m",
                "memory": str(allocated.memory),
            }
        if actual is not None:
            status["resources"] = {
                "requests": {"cpu": f"{actual.cpu}m", "memory": str(actual.memory)}
            }
        return self

    # -- kubelet status -----------------------------------------------------------------
    def status(
        self,
        container: str = "app",
        *,
        allocated: dict[str, object] | None = None,
        actual: dict[str, object] | None = None,
        init: bool = False,
    ) -> PodBuilder:
        """A container status with ``allocatedResources`` and ``resources.requests``."""
        field = "initContainerStatuses" if init else "containerStatuses"
        statuses = self._obj["status"].setdefault(field, [])
        entry: dict[str, Any] = {"name": container, "ready": True, "restartCount": 0}
        if allocated is not None:
            entry["allocatedResources"] = allocated
        if actual is not None:
            entry["resources"] = {"requests": actual}
        statuses[:] = [s for s in statuses if s["name"] != container] + [entry]
        return self

    def admitted(self) -> PodBuilder:
        """At build time, report every container allocated and running at its spec."""
        self._admitted = True
        return self

    def unschedulable(self, nominated: str = "") -> PodBuilder:
        """Unbound, and the scheduler found it no node (``PodScheduled=False``, reason
        ``Unschedulable``); ``nominated``: the node it preempts on meanwhile."""
        self.unbound()
        self._obj["status"].setdefault("conditions", []).append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        )
        if nominated:
            self._obj["status"]["nominatedNodeName"] = nominated
        return self

    def resize_pending(self, reason: str, since: float = 500.0) -> PodBuilder:
        """Condition ``PodResizePending`` with ``reason`` Deferred or Infeasible."""
        self._condition("PodResizePending", reason, since)
        return self

    def resize_error(self, message: str, generation: int) -> PodBuilder:
        """``PodResizeInProgress`` reason ``Error`` for spec ``generation``: the kubelet
        admitted a resize it could not actuate."""
        self._obj["status"].setdefault("conditions", []).append(
            {
                "type": "PodResizeInProgress",
                "status": "True",
                "reason": "Error",
                "message": message,
                "observedGeneration": generation,
                "lastTransitionTime": rfc3339(T0 + 600.0),
            }
        )
        return self

    def resize_preemption_disabled(self) -> PodBuilder:
        self._condition("PodResizePreemptionDisabled", "NodeOptedOut", 600.0)
        return self

    def _condition(self, kind: str, reason: str, since: float) -> None:
        self._obj["status"].setdefault("conditions", []).append(
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "lastTransitionTime": rfc3339(T0 + since),
            }
        )

    # -- results ------------------------------------------------------------------------
    def obj(self) -> dict[str, Any]:
        """The Pod object as ``kubectl get -o json`` would print it."""
        return copy.deepcopy(self._render())

    def _render(self) -> dict[str, Any]:
        if not self._admitted:
            return self._obj
        obj = {**self._obj, "status": dict(self._obj["status"])}
        for field, status_field in (
            ("initContainers", "initContainerStatuses"),
            ("containers", "containerStatuses"),
        ):
            statuses = []
            for c in obj["spec"].get(field, []):
                requests = dict(c.get("resources", {}).get("requests", {}))
                statuses.append(
                    {
                        "name": c["name"],
                        "allocatedResources": requests,
                        "resources": {"requests": requests},
                    }
                )
            if statuses:
                obj["status"][status_field] = statuses
        return obj

    def build(self, resolver: PriorityResolver | None = None) -> Pod:
        # The parser never changes its input: no copy needed.
        return parse_pod(self._render(), resolver or _NO_CLASSES)

    def resize(
        self,
        cpu: object = None,
        memory: object = None,
        *,
        container: str = "app",
        resolver: PriorityResolver | None = None,
    ) -> tuple[Pod, Pod]:
        """(old, new): the pod as stored and with ``container``'s requests resized.

        The patch is the one ``kubectl patch --subresource resize`` would send.
        """
        patch = resize_patch(container, cpu=cpu, memory=memory)
        return self.resize_with(patch, resolver=resolver)

    def resize_with(
        self, patch: dict[str, Any], *, resolver: PriorityResolver | None = None
    ) -> tuple[Pod, Pod]:
        stored = self.obj()
        resolver = resolver or PriorityResolver()
        return parse_pod(stored, resolver), parse_pod(apply_resize(stored, patch), resolver)

    # -- deferred resizes (appended for the reconciler's tests) -------------------------
    def holding(
        self, cpu: object = None, memory: object = None, *, container: str = "app"
    ) -> PodBuilder:
        """The kubelet allocated (and applied) only ``cpu``/``memory`` to ``container``:
        with larger requests in the spec, a resize not actuated yet."""
        granted = resource_list(cpu, memory)
        return self.status(container, allocated=granted, actual=granted)

    def generation(self, value: int) -> PodBuilder:
        self._obj["metadata"]["generation"] = value
        return self

    def deferred(self, since: float = 500.0) -> PodBuilder:
        """``PodResizePending`` reason ``Deferred`` (the kubelet found no room)."""
        return self.resize_pending("Deferred", since)


def resize_patch(
    container: str = "app", *, cpu: object = None, memory: object = None, init: bool = False
) -> dict[str, Any]:
    field = "initContainers" if init else "containers"
    return {
        "spec": {
            field: [{"name": container, "resources": {"requests": resource_list(cpu, memory)}}]
        }
    }


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
            "spec": {},
            "status": {
                "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            },
        }

    def allocatable(self, cpu: object = None, memory: object = None) -> NodeBuilder:
        self._obj["status"]["allocatable"] = {**resource_list(cpu, memory), "pods": "110"}
        return self

    def opted_out(self, value: str = "Enabled") -> NodeBuilder:
        """The 1.37 field ``spec.podPreemptionPolicy.disableResizePreemption``."""
        self._obj["spec"]["podPreemptionPolicy"] = {"disableResizePreemption": value}
        return self

    def annotate(self, key: str, value: str) -> NodeBuilder:
        self._obj["metadata"].setdefault("annotations", {})[key] = value
        return self

    def labels(self, **labels: str) -> NodeBuilder:
        self._obj["metadata"]["labels"].update(labels)
        return self

    def taint(self, key: str, effect: str = "NoSchedule", value: str = "") -> NodeBuilder:
        taint = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        self._obj["spec"].setdefault("taints", []).append(taint)
        return self

    def cordoned(self) -> NodeBuilder:
        self._obj["spec"]["unschedulable"] = True
        return self

    def ready(self, status: str = "True") -> NodeBuilder:
        self._obj["status"]["conditions"] = [{"type": "Ready", "status": status}]
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)

    def build(self) -> Node:
        return parse_node(self.obj())


class PdbBuilder:
    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1},
        }

    def selecting(self, **labels: str) -> PdbBuilder:
        self._obj["spec"]["selector"] = {"matchLabels": dict(labels)}
        return self

    def expression(self, key: str, operator: str, *values: str) -> PdbBuilder:
        selector = self._obj["spec"].setdefault("selector", {})
        expr: dict[str, Any] = {"key": key, "operator": operator}
        if values:
            expr["values"] = list(values)
        selector.setdefault("matchExpressions", []).append(expr)
        return self

    def empty_selector(self) -> PdbBuilder:
        self._obj["spec"]["selector"] = {}
        return self

    def null_selector(self) -> PdbBuilder:
        self._obj["spec"].pop("selector", None)
        return self

    def selector_spec(self, spec: str) -> PdbBuilder:
        """Table shorthand: ``"empty"`` (selects every pod), ``"null"`` (selects none),
        else the ``app`` label to select."""
        if spec == "empty":
            return self.empty_selector()
        if spec == "null":
            return self.null_selector()
        return self.selecting(app=spec)

    def allowing(self, disruptions: int) -> PdbBuilder:
        self._obj["status"]["disruptionsAllowed"] = disruptions
        return self

    def disrupted(self, *pod_names: str) -> PdbBuilder:
        self._obj["status"]["disruptedPods"] = {n: rfc3339(T0 + 1) for n in pod_names}
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)

    def build(self) -> DisruptionBudget:
        return parse_pdb(self.obj())


class PriorityClassBuilder:
    def __init__(self, name: str, value: int) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }

    def global_default(self) -> PriorityClassBuilder:
        self._obj["globalDefault"] = True
        return self

    def never_preempts(self) -> PriorityClassBuilder:
        self._obj["preemptionPolicy"] = "Never"
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)

    def build(self) -> PriorityClass:
        return parse_priority_class(self.obj())


def make_pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def make_node(name: str = NODE) -> NodeBuilder:
    return NodeBuilder(name)


def make_pdb(name: str, namespace: str = "default") -> PdbBuilder:
    return PdbBuilder(name, namespace)


def make_priority_class(name: str, value: int) -> PriorityClassBuilder:
    return PriorityClassBuilder(name, value)


def make_reservation(
    pod: str,
    *,
    cpu: str = "0",
    memory: str = "0",
    node: str = NODE,
    victims: Iterable[str] = (),
    expires_in: float = 60.0,
    namespace: str = "default",
) -> Reservation:
    """A reservation held for pod ``namespace/pod`` (uid as the pod builder makes it)."""
    from webhook.core.resources import cpu_millis, memory_bytes

    return Reservation(
        pod_uid=f"uid-{namespace}-{pod}",
        pod=f"{namespace}/{pod}",
        node=node,
        resources=Resources(cpu_millis(cpu), memory_bytes(memory)),
        victims=frozenset(victims),
        expires_at=NOW + expires_in,
    )


def uid(name: str, namespace: str = "default") -> str:
    """The uid the pod builder gives pod ``namespace/name``."""
    return f"uid-{namespace}-{name}"


def plan(
    old: Pod,
    new: Pod,
    node: Node,
    pods: Sequence[Pod] = (),
    *,
    budgets: Sequence[DisruptionBudget] = (),
    reservations: Sequence[Reservation] = (),
    policy: PreemptionPolicy | None = None,
    now: float = NOW,
) -> Plan:
    """``plan_resize`` with the resizing pod listed among the node's pods, as in a cache."""
    listed = [p for p in pods if p.uid != old.uid] + [old]
    return plan_resize(
        old,
        new,
        NodePods(node, listed),
        now=now,
        budgets=budgets,
        reservations=reservations,
        policy=policy or DefaultPolicy(),
    )


def walkthrough() -> tuple[Pod, Pod, Node, list[Pod]]:
    """The README walkthrough: node 8 CPU; low-priority-pod 3 CPU at 1000;
    high-priority-pod 4 -> 6 CPU at 1000000."""
    node = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
    low = (
        make_pod("low-priority-pod")
        .priority(LOW)
        .requests(cpu="3", memory="500Mi")
        .on(NODE)
        .started(100)
        .admitted()
        .build()
    )
    old, new = (
        make_pod("high-priority-pod")
        .priority(HIGH)
        .requests(cpu="4", memory="1Gi")
        .on(NODE)
        .started(50)
        .admitted()
        .resize(cpu="6", memory="1Gi")
    )
    return old, new, node, [low]
