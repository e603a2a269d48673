"""The kubelet's in-place resize decisions, as pure functions over pod and node JSON.

Mirrors Kubernetes v1.37.2 (``pkg/kubelet/allocation``, ``pkg/kubelet/lifecycle/predicate.go``,
``k8s.io/component-helpers/resource`` and ``pkg/kubelet/events/resize.go``); the node emulator
uses these functions and the unit tests pin them, so the emulator's behaviour can be checked
without an API server. Pods and nodes are the plain dicts the API returns.

Facts from those sources that shape this module:

* The resizing pod is checked at its *desired* requests (``PodRequests`` of the spec); every
  other admitted, non-terminal pod on the node counts at ``max(allocated, actual)`` because the
  kubelet replaces other pods' specs with their allocation before aggregating with status.
* The first failing check wins, in the order pods, cpu, memory, with the message
  ``Node didn't have enough resource: <res>, requested: N, used: M, capacity: C`` (millicores
  for cpu, bytes for memory) and the internal reason ``OutOf<res>``.
* v1.37.2 reports every fit failure as ``PodResizePending`` reason ``Deferred``, even a resize
  larger than the node's allocatable (the ``PodResizeValidator`` admission plugin normally
  rejects those before they reach the kubelet). Kubelets before 1.36 reported those as
  ``Infeasible`` with ``Node didn't have enough capacity: ...``; ``legacy_infeasible=True``
  reproduces that.
* Pending resizes are retried in this order: resizes that do not increase requests, then
  higher ``spec.priority``, then Guaranteed QoS, then the longest pending.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from harness import quantity

Pod = Mapping[str, Any]
Node = Mapping[str, Any]
ResourceList = Mapping[str, str]

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"

PENDING = "PodResizePending"
IN_PROGRESS = "PodResizeInProgress"
DEFERRED = "Deferred"
INFEASIBLE = "Infeasible"
EVENT_DEFERRED = "ResizeDeferred"
EVENT_INFEASIBLE = "ResizeInfeasible"
EVENT_STARTED = "ResizeStarted"
EVENT_COMPLETED = "ResizeCompleted"
PREEMPTION_DISABLED = "PodResizePreemptionDisabled"

# Pod condition types the kubelet rewrites on every status update; anything else (for
# example DisruptionTarget or readiness gates) is preserved (kubetypes.PodConditionsByKubelet).
KUBELET_CONDITIONS = frozenset(
    {
        "PodScheduled",
        "Ready",
        "Initialized",
        "ContainersReady",
        "PodReadyToStartContainers",
        IN_PROGRESS,
        PENDING,
    }
)
# The 1.37 node opt-out field is dropped by the API server unless the
# InPlacePodVerticalScalingSchedulerPreemption gate is on; these annotations stand in for it
# (any non-empty value other than "false").
OPT_OUT_ANNOTATIONS = (
    "resize-preemption.k8s.io/disabled",
    "resize-preemption.io/disable-resize-preemption",
)

_OUT_OF = {PODS: "OutOfpods", CPU: "OutOfcpu", MEMORY: "OutOfmemory"}


@dataclass(frozen=True, slots=True)
class Resources:
    """CPU in millicores and memory in bytes."""

    cpu: int = 0
    memory: int = 0

    @classmethod
    def of(cls, resources: ResourceList | None) -> Resources:
        """Parse the cpu and memory entries of a resource list; other names are ignored."""
        if not resources:
            return cls()
        return cls(
            cpu=quantity.milli_value(resources[CPU]) if CPU in resources else 0,
            memory=quantity.value(resources[MEMORY]) if MEMORY in resources else 0,
        )

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory)

    def max(self, *others: Resources) -> Resources:
        """Per-resource maximum."""
        result = self
        for o in others:
            result = Resources(max(result.cpu, o.cpu), max(result.memory, o.memory))
        return result

    def replace(self, resources: ResourceList) -> Resources:
        """Take cpu/memory from ``resources`` where present (pod-level resources override)."""
        parsed = Resources.of(resources)
        return Resources(
            parsed.cpu if CPU in resources else self.cpu,
            parsed.memory if MEMORY in resources else self.memory,
        )


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What the kubelet admitted for one container: raw requests and limits."""

    requests: Mapping[str, str]
    limits: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """The kubelet's allocation checkpoint for one pod."""

    containers: Mapping[str, ContainerAllocation]
    pod_level: ContainerAllocation | None = None


class Outcome(Enum):
    """What the kubelet does with a pod's desired resources."""

    NONE = "none"  # desired == allocated: nothing to do (a reverted resize clears Pending)
    ACTUATE = "actuate"
    DEFERRED = "deferred"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, slots=True)
class Decision:
    """Result of a resize check.

    ``reason`` is the kubelet's internal admit reason (``OutOfcpu``...); it appears in the
    event message ("Pod resize OutOfcpu: ..."), while the pod condition carries ``Deferred``
    or ``Infeasible``.
    """

    outcome: Outcome
    reason: str = ""
    message: str = ""

    @property
    def condition_reason(self) -> str:
        return INFEASIBLE if self.outcome is Outcome.INFEASIBLE else DEFERRED


# --- pod requests (k8s.io/component-helpers/resource) -----------------------------------


def containers(pod: Pod) -> list[Mapping[str, Any]]:
    """Init containers then app containers, the order ``podutil.ContainerIter`` uses."""
    spec = pod.get("spec", {})
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def is_sidecar(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def _aggregate(pod: Pod, pick: Any) -> Resources:
    """Sidecar-aware aggregation of ``pick(container, status)`` over a pod's containers.

    max(sum of app containers + sidecars, max over init container i of (i + sidecars before
    i)); the max is per resource, as in ``aggregateContainerResourcesByFn``.
    """
    spec = pod.get("spec", {})
    statuses = _container_statuses(pod)
    result = Resources()
    for c in spec.get("containers") or []:
        result += pick(c, statuses.get(c["name"]))
    sidecars = Resources()
    init_peak = Resources()
    for c in spec.get("initContainers") or []:
        r = pick(c, statuses.get(c["name"]))
        if is_sidecar(c):
            result += r
            sidecars += r
            use = sidecars
        else:
            use = r + sidecars
        init_peak = init_peak.max(use)
    return result.max(init_peak)


def _container_statuses(pod: Pod) -> dict[str, Mapping[str, Any]]:
    status = pod.get("status", {})
    found: dict[str, Mapping[str, Any]] = {}
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        found.setdefault(cs["name"], cs)
    return found


def _spec_requests(c: Mapping[str, Any], _cs: Mapping[str, Any] | None) -> Resources:
    return Resources.of((c.get("resources") or {}).get("requests"))


def _spec_limits(c: Mapping[str, Any], _cs: Mapping[str, Any] | None) -> Resources:
    return Resources.of((c.get("resources") or {}).get("limits"))


def _allocated_requests(c: Mapping[str, Any], cs: Mapping[str, Any] | None) -> Resources:
    if cs is not None and cs.get("allocatedResources") is not None:
        return Resources.of(cs["allocatedResources"])
    return _spec_requests(c, cs)


def _actuated_requests(c: Mapping[str, Any], cs: Mapping[str, Any] | None) -> Resources:
    if cs is not None and (cs.get("resources") or {}).get("requests") is not None:
        return Resources.of(cs["resources"]["requests"])
    return _allocated_requests(c, cs)


def is_resize_infeasible(pod: Pod) -> bool:
    return _pending_reason(pod) == INFEASIBLE


def _pending_reason(pod: Pod) -> str | None:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == PENDING:
            return str(c.get("reason", ""))
    return None


def _pod_level(pod: Pod, key: str) -> ResourceList | None:
    """Pod-level requests or limits, if any cpu/memory entry is set."""
    values = (pod.get("spec", {}).get("resources") or {}).get(key) or {}
    if any(name in (CPU, MEMORY) or name.startswith("hugepages-") for name in values):
        return {k: v for k, v in values.items() if k in (CPU, MEMORY)}
    return None


def pod_requests(pod: Pod, *, use_status: bool = False) -> Resources:
    """``resource.PodRequests`` for cpu and memory, overhead included.

    ``use_status=False`` is the spec view (the scheduler's and the kubelet's view of the pod
    being admitted or resized). ``use_status=True`` is ``max(spec, allocated, actual)``
    (``UseStatusResources`` with pod-level in-place resize on, the 1.37 default); when the
    pod's resize is Infeasible its spec is ignored.
    """
    infeasible = use_status and is_resize_infeasible(pod)
    status = pod.get("status", {})
    if not use_status:
        result = _aggregate(pod, _spec_requests)
    else:
        spec_reqs = _aggregate(pod, _spec_requests)
        pod_alloc = status.get("allocatedResources")
        pod_actual = (status.get("resources") or {}).get("requests")
        if pod_alloc is not None and pod_actual is not None:
            allocated, actual = Resources.of(pod_alloc), Resources.of(pod_actual)
        else:
            allocated = _aggregate(pod, _allocated_requests)
            actual = _aggregate(pod, _actuated_requests)
        result = actual.max(allocated) if infeasible else spec_reqs.max(actual, allocated)

    level = _pod_level(pod, "requests")
    if level is not None:
        # applyPodLevelResources: pod-level values replace the container aggregate for every
        # resource they name; with status, max(spec, actual, allocated) per resource.
        names = set(level)
        effective = Resources.of(level)
        if use_status and status.get("resources") is not None:
            actual_list = status["resources"].get("requests") or {}
            allocated_list = status.get("allocatedResources") or {}
            names |= {n for n in (*actual_list, *allocated_list) if n in (CPU, MEMORY)}
            effective = (Resources() if infeasible else effective).max(
                Resources.of(actual_list), Resources.of(allocated_list)
            )
        result = Resources(
            effective.cpu if CPU in names else result.cpu,
            effective.memory if MEMORY in names else result.memory,
        )
    return result + Resources.of(pod.get("spec", {}).get("overhead"))


def pod_limits(pod: Pod) -> dict[str, str]:
    """``resource.PodLimits`` of the spec as a resource list (cpu/memory set in any container).

    Overhead is added only to resources that have a limit, as upstream does.
    """
    names = {
        name
        for c in containers(pod)
        for name in ((c.get("resources") or {}).get("limits") or {})
        if name in (CPU, MEMORY)
    }
    level = _pod_level(pod, "limits")
    if level:
        names |= set(level)
    if not names:
        return {}
    total = _aggregate(pod, _spec_limits)
    if level:
        total = total.replace(level)
    total += Resources.of(pod.get("spec", {}).get("overhead"))
    out: dict[str, str] = {}
    if CPU in names:
        out[CPU] = quantity.format_cpu(total.cpu)
    if MEMORY in names:
        out[MEMORY] = quantity.format_bytes(total.memory)
    return out


def requests_list(resources: Resources) -> dict[str, str]:
    """A resource list with both cpu and memory in canonical form."""
    return {
        CPU: quantity.format_cpu(resources.cpu),
        MEMORY: quantity.format_bytes(resources.memory),
    }


# --- allocation ---------------------------------------------------------------------------


def allocation_from_spec(pod: Pod) -> PodAllocation:
    """The allocation a pod gets when it is admitted or its resize is accepted: its spec."""
    allocs = {
        c["name"]: ContainerAllocation(
            requests=dict((c.get("resources") or {}).get("requests") or {}),
            limits=dict((c.get("resources") or {}).get("limits") or {}),
        )
        for c in containers(pod)
    }
    level = pod.get("spec", {}).get("resources")
    pod_level = (
        ContainerAllocation(
            requests=dict(level.get("requests") or {}), limits=dict(level.get("limits") or {})
        )
        if level
        else None
    )
    return PodAllocation(containers=allocs, pod_level=pod_level)


def allocation_from_status(pod: Pod) -> PodAllocation | None:
    """Rebuild an allocation from what a kubelet reported (emulator restart), if any."""
    statuses = _container_statuses(pod)
    if not statuses or not all(
        cs.get("allocatedResources") is not None or not cs.get("resources")
        for cs in statuses.values()
    ):
        return None
    allocs: dict[str, ContainerAllocation] = {}
    for c in containers(pod):
        cs = statuses.get(c["name"])
        if cs is None:
            return None
        allocs[c["name"]] = ContainerAllocation(
            requests=dict(cs.get("allocatedResources") or {}),
            limits=dict((cs.get("resources") or {}).get("limits") or {}),
        )
    spec_level = pod.get("spec", {}).get("resources")
    status_level = pod.get("status", {}).get("resources")
    pod_level = None
    if spec_level and status_level:
        pod_level = ContainerAllocation(
            requests={k: v for k, v in (status_level.get("requests") or {}).items()},
            limits={k: v for k, v in (status_level.get("limits") or {}).items()},
        )
    return PodAllocation(containers=allocs, pod_level=pod_level)


def with_allocation(pod: Pod, allocation: PodAllocation) -> dict[str, Any]:
    """``UpdatePodFromAllocation``: a copy of ``pod`` whose spec resources are the allocation."""
    out = dict(pod)
    spec = dict(pod.get("spec", {}))
    for key in ("initContainers", "containers"):
        if spec.get(key):
            spec[key] = [_allocated_container(c, allocation) for c in spec[key]]
    if allocation.pod_level is not None and spec.get("resources"):
        spec["resources"] = _requirements(allocation.pod_level)
    out["spec"] = spec
    return out


def _allocated_container(c: Mapping[str, Any], allocation: PodAllocation) -> Mapping[str, Any]:
    alloc = allocation.containers.get(c["name"])
    if alloc is None:
        return c
    return {**c, "resources": _requirements(alloc) | _claims(c)}


def _requirements(alloc: ContainerAllocation) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if alloc.limits:
        out["limits"] = dict(alloc.limits)
    if alloc.requests:
        out["requests"] = dict(alloc.requests)
    return out


def _claims(c: Mapping[str, Any]) -> dict[str, Any]:
    claims = (c.get("resources") or {}).get("claims")
    return {"claims": claims} if claims else {}


def _same(a: Mapping[str, str] | None, b: Mapping[str, str] | None) -> bool:
    a, b = a or {}, b or {}
    if set(a) != set(b):
        return False
    return all(quantity.parse(a[k]) == quantity.parse(b[k]) for k in a)


def resize_requested(pod: Pod, allocation: PodAllocation) -> bool:
    """True when the desired resources differ from the allocation (``updated`` upstream)."""
    for c in containers(pod):
        alloc = allocation.containers.get(c["name"])
        if alloc is None:
            continue
        res = c.get("resources") or {}
        if not _same(res.get("requests"), alloc.requests) or not _same(
            res.get("limits"), alloc.limits
        ):
            return True
    level = pod.get("spec", {}).get("resources")
    if level and allocation.pod_level is not None:
        return not (
            _same(level.get("requests"), allocation.pod_level.requests)
            and _same(level.get("limits"), allocation.pod_level.limits)
        )
    return False


def is_resize_increasing(pod: Pod, allocation: PodAllocation) -> bool:
    """``isResizeIncreasingRequests``: desired cpu or memory requests above the allocation."""
    if not resize_requested(pod, allocation):
        return False
    old = pod_requests(with_allocation(pod, allocation))
    new = pod_requests(pod)
    return new.cpu > old.cpu or new.memory > old.memory


def in_use(pod: Pod, allocation: PodAllocation) -> Resources:
    """How much of the node another admitted pod holds in the kubelet's accounting."""
    return pod_requests(with_allocation(pod, allocation), use_status=True)


# --- fit ----------------------------------------------------------------------------------


def node_allocatable(node: Node) -> tuple[Resources, int]:
    """cpu/memory allocatable and the allowed pod count of a node."""
    allocatable = node.get("status", {}).get("allocatable") or {}
    pods = quantity.value(allocatable[PODS]) if PODS in allocatable else 0
    return Resources.of(allocatable), pods


def is_terminal(pod: Pod) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def insufficient_message(resource: str, requested: int, used: int, capacity: int) -> str:
    """``lifecycle.InsufficientResourceError.Error()``."""
    return (
        f"Node didn't have enough resource: {resource}, requested: {requested}, "
        f"used: {used}, capacity: {capacity}"
    )


def check_fit(
    request: Resources, others: Sequence[Resources], allocatable: Resources, allowed_pods: int
) -> Decision:
    """The kubelet's predicate admit check (``noderesources.Fits``, first failure wins).

    ``request`` is the pod's desired request; ``others`` the in-use amounts of every other
    admitted, non-terminal pod on the node.
    """
    used = sum(others, Resources())
    failures: list[tuple[str, int, int, int]] = []
    if len(others) + 1 > allowed_pods:
        failures.append((PODS, 1, len(others), allowed_pods))
    if request.cpu or request.memory:
        if request.cpu > 0 and request.cpu > allocatable.cpu - used.cpu:
            failures.append((CPU, request.cpu, used.cpu, allocatable.cpu))
        if request.memory > 0 and request.memory > allocatable.memory - used.memory:
            failures.append((MEMORY, request.memory, used.memory, allocatable.memory))
    if not failures:
        return Decision(Outcome.ACTUATE)
    name, req, u, cap = failures[0]
    return Decision(Outcome.DEFERRED, _OUT_OF[name], insufficient_message(name, req, u, cap))


def legacy_infeasible(request: Resources, allocatable: Resources) -> Decision | None:
    """Pre-1.36 kubelets: a request above allocatable is Infeasible (memory reported first)."""
    if request.memory > allocatable.memory:
        detail = f"memory, requested: {request.memory}, capacity: {allocatable.memory}"
    elif request.cpu > allocatable.cpu:
        detail = f"cpu, requested: {request.cpu}, capacity: {allocatable.cpu}"
    else:
        return None
    return Decision(Outcome.INFEASIBLE, INFEASIBLE, f"Node didn't have enough capacity: {detail}")


def decide_resize(
    pod: Pod,
    allocation: PodAllocation,
    others: Iterable[tuple[Pod, PodAllocation]],
    node: Node,
    *,
    legacy_infeasible_check: bool = False,
) -> Decision:
    """``handlePodResourcesResize``: what happens to ``pod``'s desired resources now.

    ``others`` are the other pods bound to the node together with their allocation; pods
    without one (not admitted yet) must be left out by the caller, terminal ones are skipped.
    """
    if not resize_requested(pod, allocation):
        return Decision(Outcome.NONE)
    allocatable, allowed_pods = node_allocatable(node)
    request = pod_requests(pod)
    if legacy_infeasible_check and (verdict := legacy_infeasible(request, allocatable)):
        return verdict
    used = [
        in_use(p, a)
        for p, a in others
        if p["metadata"]["uid"] != pod["metadata"]["uid"] and not is_terminal(p)
    ]
    return check_fit(request, used, allocatable, allowed_pods)


def decide_admission(pod: Pod, others: Iterable[tuple[Pod, PodAllocation]], node: Node) -> Decision:
    """Admission of a newly bound pod (``AddPod``): same predicate, at the pod's spec."""
    allocatable, allowed_pods = node_allocatable(node)
    used = [
        in_use(p, a)
        for p, a in others
        if p["metadata"]["uid"] != pod["metadata"]["uid"] and not is_terminal(p)
    ]
    return check_fit(pod_requests(pod), used, allocatable, allowed_pods)


# --- ordering -----------------------------------------------------------------------------


def priority(pod: Pod) -> int:
    return int(pod.get("spec", {}).get("priority") or 0)


def is_guaranteed(pod: Pod) -> bool:
    """QoS is computed by the API server at creation and cannot change on resize."""
    return bool(pod.get("status", {}).get("qosClass") == "Guaranteed")


def retry_order_key(
    pod: Pod, allocation: PodAllocation, pending_since: float | None
) -> tuple[bool, int, bool, bool, float]:
    """Sort key for pending resizes (``sortPendingResizes``); smaller is retried first.

    ``pending_since`` is when the pod's PodResizePending condition last changed reason
    (None when it has none yet: those go last).
    """
    return (
        is_resize_increasing(pod, allocation),
        -priority(pod),
        not is_guaranteed(pod),
        pending_since is None,
        pending_since or 0.0,
    )


# --- node opt-out ---------------------------------------------------------------------------


def resize_preemption_opt_outs(node: Node) -> tuple[str, ...]:
    """Owners that disabled resize preemption on ``node`` (empty: preemption allowed).

    Reads ``spec.podPreemptionPolicy.disableResizePreemption`` (1.37, alpha gate) and the
    stand-in annotations for API servers that drop that field.
    """
    policy = (node.get("spec") or {}).get("podPreemptionPolicy") or {}
    owners = tuple(policy.get("disableResizePreemption") or ())
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    for key in OPT_OUT_ANNOTATIONS:
        if annotations.get(key, "").strip().lower() not in ("", "false"):
            owners += (key,)
    return owners


# --- messages -----------------------------------------------------------------------------


def resize_event_message(prefix: str, pod: Pod, error: str = "") -> str:
    """``events.podResizeMessage``: "<prefix>: <JSON summary of the spec's resources>".

    The JSON follows Go's encoding: field order of the structs, map keys sorted, empty
    resource lists omitted, ``error`` omitted when empty.
    """
    summary: dict[str, Any] = {}
    spec = pod.get("spec", {})
    for key in ("initContainers", "containers"):
        items = [
            {"name": c["name"], "resources": _go_requirements(c.get("resources") or {})}
            for c in spec.get(key) or []
        ]
        if items:
            summary[key] = items
    summary["generation"] = int(pod.get("metadata", {}).get("generation") or 0)
    if error:
        summary["error"] = error
    return f"{prefix}: {json.dumps(summary, separators=(',', ':'), ensure_ascii=False)}"


def _go_requirements(resources: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("limits", "requests"):
        if resources.get(key):
            out[key] = dict(sorted(resources[key].items()))
    if resources.get("claims"):
        out["claims"] = copy.deepcopy(resources["claims"])
    return out


def pending_event(decision: Decision, pod: Pod) -> tuple[str, str]:
    """Event reason and message for a Deferred/Infeasible decision."""
    reason = EVENT_INFEASIBLE if decision.outcome is Outcome.INFEASIBLE else EVENT_DEFERRED
    return reason, resize_event_message(f"Pod resize {decision.reason}", pod, decision.message)
