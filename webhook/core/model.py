"""Slim, frozen views of the Kubernetes objects a resize decision reads.

They hold only what the decision needs, already parsed (quantities as integers, times as
epoch seconds), so the cluster cache can keep hundreds of thousands of them and the
planner never touches raw JSON. Build them with :mod:`webhook.core.objects`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from webhook.core.resources import ZERO, ResourceName, Resources

PreemptionPolicyName = Literal["PreemptLowerPriority", "Never"]
ResizeState = Literal["none", "deferred", "infeasible"]
PdbMode = Literal["respect", "best-effort"]

NEVER: Final = "Never"

#: Our opt-out for nodes on clusters older than 1.37 (which lack
#: ``spec.podPreemptionPolicy.disableResizePreemption``). Any non-empty value opts out.
NODE_OPT_OUT_ANNOTATION: Final = "resize-preemption.io/disable-resize-preemption"
#: Opt-in for the mutating endpoint: shrink an unfittable resize to what fits.
FIT_TO_NODE_ANNOTATION: Final = "resize-preemption.io/fit-to-node"
MIRROR_POD_ANNOTATION: Final = "kubernetes.io/config.mirror"
#: Opt-in to lending: a JSON object mapping container names to the least each can run
#: with, e.g. ``{"worker": {"cpu": "1", "memory": "512Mi"}}`` (docs/lending.md).
FLOOR_ANNOTATION: Final = "resize-preemption.io/floor"
#: A lender's own record of the loans it made: what it asked for before each, who
#: borrowed and when (:func:`webhook.core.lending.records`). Written before a loan is made
#: and removed once it ended, so a loan outlives the ledger entry that borrowed it.
LOANS_ANNOTATION: Final = "resize-preemption.io/loans"
#: Annotations a cached pod keeps: this project's own, which the worker and the reviews
#: read. Others, e.g. ``kubectl.kubernetes.io/last-applied-configuration``, can be
#: kilobytes per pod, and no decision reads them.
KEPT_ANNOTATION_PREFIXES: Final = ("resize-preemption.io/",)
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod's identity: ``namespace/name`` plus the uid that tells incarnations apart."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True, slots=True)
class Container:
    """A container's declared resources. ``sidecar`` marks a restartable init container."""

    name: str
    requests: Resources = ZERO
    limits: Resources = ZERO
    sidecar: bool = False


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    """What the kubelet reports for a container.

    ``allocated`` is ``allocatedResources`` (the requests the kubelet admitted); ``actual``
    is ``resources.requests`` (what the runtime has applied). Either may be absent on
    older clusters or before the container started.
    """

    name: str
    allocated: Resources | None = None
    actual: Resources | None = None


@dataclass(frozen=True, slots=True)
class Floor:
    """The least one container's resource may be lowered to when its pod lends.

    Only floors it can be lowered to without a restart are kept: the container is
    resizable in place (an app container or a sidecar) and its ``resizePolicy`` for the
    resource does not restart it.
    """

    container: str
    resource: ResourceName
    amount: int


@dataclass(frozen=True, slots=True)
class Taint:
    """One of a node's ``spec.taints``."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """One of a pod's ``spec.tolerations`` (``operator`` Equal or Exists; an empty
    ``effect`` tolerates every effect, an empty ``key`` with Exists every taint)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """``Toleration.ToleratesTaint`` of k8s.io/api/core/v1."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One ``matchExpressions`` (or, with ``field``, ``matchFields``) entry of a
    ``nodeSelectorTerm``."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    field: bool = False

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.field:  # only metadata.name is a selectable node field
            value: str | None = name if self.key == "metadata.name" else None
        else:
            value = labels.get(self.key)
        op = self.operator
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op in ("Gt", "Lt") and value is not None and len(self.values) == 1:
            try:
                have, bound = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > bound if op == "Gt" else have < bound
        return False


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod's replacement may be scheduled: what of its spec constrains the node.

    ``terms`` are ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``
    (any one must match; none: every node). ``unknown`` says why the place cannot be
    judged from the node alone (inter-pod affinity, topology spread, volumes); empty
    when it can.
    """

    node_selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[NodeRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    unknown: str = ""


#: A pod that constrains its node in no way.
ANYWHERE: Final = Placement()


@dataclass(frozen=True, slots=True)
class Pod:
    """The parts of a Pod that resource accounting and victim selection read."""

    namespace: str
    name: str
    uid: str
    node: str = ""
    priority: int = 0
    preemption_policy: PreemptionPolicyName = "PreemptLowerPriority"
    #: ``status.startTime`` in epoch seconds; ``None`` for a pod that has not started.
    start_time: float | None = None
    phase: str = "Running"
    terminating: bool = False
    mirror: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    overhead: Resources = ZERO
    #: Pod-level ``spec.resources.requests``/``limits``; zero components are unset.
    pod_requests: Resources = ZERO
    pod_limits: Resources = ZERO
    #: Container statuses by container name, app and init containers alike. Empty when
    #: the kubelet has not reported any.
    statuses: Mapping[str, ContainerStatus] = field(default_factory=dict)
    #: Pod-level ``status.allocatedResources`` and ``status.resources.requests``.
    pod_allocated: Resources | None = None
    pod_actual: Resources | None = None
    #: ``PodResizePending`` reason, lower-cased; ``none`` when no resize is pending.
    resize: ResizeState = "none"
    #: When the current ``PodResizePending`` condition was set (epoch seconds).
    resize_pending_since: float | None = None
    #: The kubelet set ``PodResizePreemptionDisabled=True`` (node opted out, 1.37+).
    resize_preemption_disabled: bool = False
    #: The message of ``PodResizeInProgress`` with reason ``Error``: the kubelet admitted
    #: the resize but could not actuate it (e.g. "cannot decrease memory limits: ...");
    #: empty otherwise. ``resize_error_generation`` is the condition's
    #: ``observedGeneration``: the spec generation the error is about.
    resize_error: str = ""
    resize_error_generation: int = 0
    qos_class: str = ""
    #: From :data:`FLOOR_ANNOTATION`, in container order, cpu before memory.
    floors: tuple[Floor, ...] = ()
    #: Why the floor annotation was not used (malformed); empty when it was, or is absent.
    #: The pod is then an ordinary candidate; the message is for a warning event on it.
    floor_error: str = ""
    generation: int = 0
    #: The kind of the owner reference with ``controller: true`` (``ReplicaSet``...);
    #: empty for a bare pod.
    controller: str = ""
    #: The uid of that owner: a replacement the controller makes carries the same one.
    controller_uid: str = ""
    #: The scheduler found no node for the pod (``PodScheduled=False``, reason
    #: ``Unschedulable``) and nominated none to preempt on.
    unschedulable: bool = False
    #: What constrains the node a replacement of the pod could run on.
    placement: Placement = ANYWHERE
    #: ``metadata.resourceVersion``: which version of the object this is. Not compared:
    #: two versions that read the same are the same pod to every decision.
    resource_version: str = field(default="", compare=False)

    @property
    def ref(self) -> PodRef:
        return PodRef(self.namespace, self.name, self.uid)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: holds no resources on its node."""
        return self.phase in TERMINAL_PHASES

    @property
    def leaving(self) -> bool:
        """Terminating or terminal: no victim, lender or resize of it is acted on."""
        return self.terminating or self.terminal

    def all_containers(self) -> tuple[Container, ...]:
        return self.init_containers + self.containers

    def container(self, name: str) -> Container | None:
        for c in self.all_containers():
            if c.name == name:
                return c
        return None

    def with_containers(
        self, containers: tuple[Container, ...], init_containers: tuple[Container, ...]
    ) -> Pod:
        """The same pod with other declared container resources (a resize)."""
        return replace(self, containers=containers, init_containers=init_containers)

    def same_declared_resources(self, other: Pod) -> bool:
        """True when the two carry the same requests and limits everywhere."""
        return (
            self.containers == other.containers
            and self.init_containers == other.init_containers
            and self.pod_requests == other.pod_requests
            and self.pod_limits == other.pod_limits
        )


@dataclass(frozen=True, slots=True)
class Node:
    """A node's allocatable resources and its resize-preemption opt-out."""

    name: str
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    #: ``spec.podPreemptionPolicy.disableResizePreemption`` (1.37) or our annotation.
    resize_preemption_disabled: bool = False
    taints: tuple[Taint, ...] = ()
    #: ``spec.unschedulable``: cordoned.
    unschedulable: bool = False
    #: The ``Ready`` condition is True (or the node reports no conditions at all, as a
    #: hand-written snapshot's nodes).
    ready: bool = True


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry of a label selector."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A ``metav1.LabelSelector``: every label and every expression must match."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        expressions = self.match_expressions
        return not expressions or all(r.matches(labels) for r in expressions)


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget's selector and the status the disruption controller keeps."""

    namespace: str
    name: str
    #: ``None`` for a null selector (matches nothing); an empty selector is ``{}``.
    selector: LabelSelector | None
    disruptions_allowed: int
    #: Pod names in ``status.disruptedPods``: evictions the API server already admitted.
    disrupted_pods: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Namespace:
    """What the preemptor policy reads of a namespace: its labels (the API server sets
    ``kubernetes.io/metadata.name`` on every one)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    global_default: bool = False
    preemption_policy: PreemptionPolicyName = "PreemptLowerPriority"
