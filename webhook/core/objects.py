"""Raw Kubernetes JSON (as the API or ``kubectl get -o yaml`` gives it) -> slim views.

Every function here is defensive: a field of the wrong type raises :class:`ObjectError`
naming the object and the field, never ``KeyError``/``TypeError``. Missing optional
fields take the API's defaults.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, cast

from webhook.core.errors import InputError, ObjectError
from webhook.core.model import (
    ANYWHERE,
    FLOOR_ANNOTATION,
    MIRROR_POD_ANNOTATION,
    NEVER,
    NODE_OPT_OUT_ANNOTATION,
    Container,
    ContainerStatus,
    DisruptionBudget,
    Floor,
    LabelSelector,
    Namespace,
    Node,
    NodeRequirement,
    Placement,
    Pod,
    PreemptionPolicyName,
    PriorityClass,
    Requirement,
    ResizeState,
    Taint,
    Toleration,
)
from webhook.core.resources import RESOURCE_NAMES, ZERO, Resources, cpu_millis, memory_bytes

Obj = Mapping[str, Any]
_EMPTY: Obj = {}
_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def _describe(obj: Obj) -> str:
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        ns, name = meta.get("namespace"), meta.get("name")
        if isinstance(name, str):
            return f"{obj.get('kind') or 'object'} {ns}/{name}" if ns else f"{name}"
    return str(obj.get("kind") or "object")


# Every helper names the field in an error as ``where + field``, joined only then: the
# cache parses every pod of a cluster and a review two pods, and building each field's
# path up front cost a third of a pod's parse.


def _map(value: object, where: str, field: str = "") -> Obj:
    # Decoded JSON is made of plain dicts: tell them apart before the (slower) ABC check.
    if type(value) is dict:
        return value
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise ObjectError(f"{where}{field} must be an object, not {type(value).__name__}")
    return cast(Obj, value)


def _list(value: object, where: str, field: str = "") -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObjectError(f"{where}{field} must be a list, not {type(value).__name__}")
    return value


def _str(value: object, where: str, field: str = "", *, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise ObjectError(f"{where}{field} must be a string, not {type(value).__name__}")
    return value


def _int(value: object, where: str, field: str = "", *, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ObjectError(f"{where}{field} must be an integer, not {value!r}")
    return value


def _labels(value: object, where: str, field: str = "") -> dict[str, str]:
    raw = _map(value, where, field)
    for k, v in raw.items():
        if not isinstance(v, str):
            raise ObjectError(f"{where}{field}.{k} must be a string, not {v!r}")
    return dict(raw)


def parse_time(value: object, where: str, field: str = "") -> float | None:
    """RFC 3339 timestamp -> epoch seconds (``None`` when absent).

    A time without an offset is taken as UTC (what the API server writes), never as the
    local time of the machine, which would make the result depend on the environment.
    """
    if value is None:
        return None
    text = _str(value, where, field)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ObjectError(f"{where}{field}: {text!r} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_resources(value: object, where: str, field: str = "") -> Resources:
    """A ``ResourceList`` (``{"cpu": "2", "memory": "1Gi", ...}``); other names ignored.
    Errors name ``where + field``."""
    raw = _map(value, where, field)
    cpu, memory = raw.get("cpu"), raw.get("memory")
    if cpu is None and memory is None:
        return ZERO
    return Resources(
        0 if cpu is None else cpu_millis(cpu, where=where, field=field, name=".cpu"),
        0 if memory is None else memory_bytes(memory, where=where, field=field, name=".memory"),
    )


def _optional_resources(value: object, where: str, field: str) -> Resources | None:
    return None if value is None else parse_resources(value, where, field)


def _container(raw: object, where: str, *, init: bool) -> Container:
    c = _map(raw, where)
    name = _str(c.get("name"), where, ".name")
    if not name:
        raise ObjectError(f"{where}.name is missing")
    resources = _map(c.get("resources"), where, ".resources")
    limits = parse_resources(resources.get("limits"), where, ".resources.limits")
    req_raw = _map(resources.get("requests"), where, ".resources.requests")
    requests = parse_resources(req_raw, where, ".resources.requests")
    # API defaulting: a request left unset takes the limit's value.
    if "cpu" not in req_raw and limits.cpu:
        requests = requests.replace("cpu", limits.cpu)
    if "memory" not in req_raw and limits.memory:
        requests = requests.replace("memory", limits.memory)
    sidecar = init and c.get("restartPolicy") == "Always"
    return Container(name, requests, limits, sidecar)


def _status(raw: object, where: str) -> ContainerStatus:
    s = _map(raw, where)
    name = _str(s.get("name"), where, ".name")
    actual_raw = _map(s.get("resources"), where, ".resources")
    return ContainerStatus(
        name,
        _optional_resources(s.get("allocatedResources"), where, ".allocatedResources"),
        _optional_resources(actual_raw.get("requests"), where, ".resources.requests"),
    )


class _Conditions(NamedTuple):
    """What a pod's ``status.conditions`` (and the legacy ``status.resize``) say."""

    #: ``PodResizePending`` (the last one that is True) and when it was set.
    resize: ResizeState
    resize_since: float | None
    #: ``PodResizePreemptionDisabled=True``.
    preemption_disabled: bool
    #: The first ``PodResizeInProgress=True`` with reason ``Error``: its message and
    #: ``observedGeneration``.
    error: str
    error_generation: int
    #: The first ``PodScheduled``: False with reason ``Unschedulable``.
    unschedulable: bool


def _conditions(status: Obj, where: str) -> _Conditions:
    """Reads every condition in one pass; errors name the condition's field."""
    state: ResizeState = "none"
    since: float | None = None
    disabled = False
    error, error_generation = "", 0
    scheduled: Obj | None = None
    for i, raw in enumerate(_list(status.get("conditions"), where, ".status.conditions")):
        cond = raw if type(raw) is dict else _map(raw, where, f".status.conditions[{i}]")
        kind, value = cond.get("type"), cond.get("status")
        if kind == "PodResizePending" and value == "True":
            reason = cond.get("reason")
            if reason in ("Deferred", "Infeasible"):
                state = "deferred" if reason == "Deferred" else "infeasible"
                since = parse_time(
                    cond.get("lastTransitionTime"), where, f".status.conditions[{i}]"
                )
        elif kind == "PodResizePreemptionDisabled" and value == "True":
            disabled = True
        elif kind == "PodResizeInProgress" and value == "True" and cond.get("reason") == "Error":
            if not error:
                field = f".status.conditions[{i}]"
                error = _str(cond.get("message"), where, f"{field}.message") or "Error"
                error_generation = _int(
                    cond.get("observedGeneration"), where, f"{field}.observedGeneration"
                )
        elif kind == "PodScheduled" and scheduled is None:
            scheduled = cond
    # Before 1.33 the kubelet reported the resize state in status.resize.
    legacy = status.get("resize")
    if state == "none" and legacy in ("Deferred", "Infeasible"):
        state = "deferred" if legacy == "Deferred" else "infeasible"
    unschedulable = (
        not status.get("nominatedNodeName")
        and scheduled is not None
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    )
    return _Conditions(state, since, disabled, error, error_generation, unschedulable)


class PriorityResolver:
    """Resolves a pod's priority and preemption policy the way the Priority plugin does.

    ``spec.priority`` wins; else the value of ``priorityClassName``'s class; else the
    globalDefault class; else 0. ``preemptionPolicy`` follows the same chain and
    defaults to ``PreemptLowerPriority``. Live API pods already carry both fields.
    """

    def __init__(self, classes: Iterable[PriorityClass] = ()) -> None:
        self._classes = {c.name: c for c in classes}
        defaults = sorted(
            (c for c in self._classes.values() if c.global_default),
            key=lambda c: (-c.value, c.name),
        )
        self._default = defaults[0] if defaults else None

    def resolve(self, spec: Obj, where: str, field: str = "") -> tuple[int, PreemptionPolicyName]:
        """(priority, preemption policy) of a pod's ``spec``; errors name
        ``where + field`` (the spec) and the field within it."""
        class_name = _str(spec.get("priorityClassName"), where, f"{field}.priorityClassName")
        cls = self._classes.get(class_name) if class_name else self._default
        if class_name and cls is None and spec.get("priority") is None:
            raise ObjectError(f"{where}{field}.priorityClassName: no PriorityClass {class_name!r}")
        priority = spec.get("priority")
        value = (
            _int(priority, where, f"{field}.priority")
            if priority is not None
            else (cls.value if cls else 0)
        )
        policy_raw = spec.get("preemptionPolicy")
        if policy_raw is None:
            policy: PreemptionPolicyName = cls.preemption_policy if cls else "PreemptLowerPriority"
        elif policy_raw in ("PreemptLowerPriority", NEVER):
            policy = cast(PreemptionPolicyName, policy_raw)
        else:
            raise ObjectError(f"{where}{field}.preemptionPolicy: unknown value {policy_raw!r}")
        return value, policy


_NO_CLASSES = PriorityResolver()


def parse_pod(obj: Obj, priorities: PriorityResolver = _NO_CLASSES) -> Pod:
    """A Pod object -> :class:`Pod`. Raises :class:`ObjectError` on a malformed object."""
    raw_meta = obj.get("metadata")
    meta: Obj = raw_meta if type(raw_meta) is dict else _EMPTY
    namespace, name = meta.get("namespace"), meta.get("name")
    if type(namespace) is not str or type(name) is not str or not name:
        # Off the common path: name the object as best it can be named.
        head = _describe(obj) if obj.get("kind") else "pod"
        meta = _map(raw_meta, head, ".metadata")
        namespace = _str(meta.get("namespace"), head, ".metadata.namespace", default="default")
        name = _str(meta.get("name"), head, ".metadata.name")
        if not name:
            raise ObjectError(f"{head}: metadata.name is missing")
    where = f"pod {namespace}/{name}"
    spec = _map(obj.get("spec"), where, ".spec")
    status = _map(obj.get("status"), where, ".status")
    annotations = _labels(meta.get("annotations"), where, ".metadata.annotations")
    priority, policy = priorities.resolve(spec, where, ".spec")
    containers, init_containers, pod_requests, pod_limits = _declared(spec, where)
    statuses: dict[str, ContainerStatus] = {}
    for field in ("initContainerStatuses", "containerStatuses"):
        for i, raw in enumerate(_list(status.get(field), where, f".status.{field}")):
            st = _status(raw, f"{where}.status.{field}[{i}]")
            statuses[st.name] = st
    pod_status_resources = _map(status.get("resources"), where, ".status.resources")
    conditions = _conditions(status, where)
    controller, controller_uid = _controller(meta.get("ownerReferences"), where)
    floor_text = annotations.get(FLOOR_ANNOTATION)
    floors, floor_error = ((), "") if floor_text is None else parse_floors(floor_text, spec)
    return Pod(
        namespace=namespace,
        name=name,
        # Hand-written snapshots often omit uids; the key still tells pods apart.
        uid=_str(meta.get("uid"), where, ".metadata.uid") or f"{namespace}/{name}",
        node=_str(spec.get("nodeName"), where, ".spec.nodeName"),
        priority=priority,
        preemption_policy=policy,
        start_time=parse_time(status.get("startTime"), where, ".status.startTime"),
        phase=_str(status.get("phase"), where, ".status.phase", default="Pending"),
        terminating=meta.get("deletionTimestamp") is not None,
        mirror=MIRROR_POD_ANNOTATION in annotations,
        labels=_labels(meta.get("labels"), where, ".metadata.labels"),
        annotations=annotations,
        containers=containers,
        init_containers=init_containers,
        overhead=parse_resources(spec.get("overhead"), where, ".spec.overhead"),
        pod_requests=pod_requests,
        pod_limits=pod_limits,
        statuses=statuses,
        pod_allocated=_optional_resources(
            status.get("allocatedResources"), where, ".status.allocatedResources"
        ),
        pod_actual=_optional_resources(
            pod_status_resources.get("requests"), where, ".status.resources.requests"
        ),
        resize=conditions.resize,
        resize_pending_since=conditions.resize_since,
        resize_preemption_disabled=conditions.preemption_disabled,
        resize_error=conditions.error,
        resize_error_generation=conditions.error_generation,
        qos_class=_str(status.get("qosClass"), where, ".status.qosClass"),
        floors=floors,
        floor_error=floor_error,
        generation=_int(meta.get("generation"), where, ".metadata.generation"),
        controller=controller,
        controller_uid=controller_uid,
        unschedulable=conditions.unschedulable,
        placement=_placement(spec, where),
        resource_version=_str(meta.get("resourceVersion"), where, ".metadata.resourceVersion"),
    )


def _controller(value: object, where: str) -> tuple[str, str]:
    """(kind, uid) of the owner reference marked ``controller: true``; empty when none."""
    if value is None:
        return "", ""
    for i, raw in enumerate(_list(value, where, ".metadata.ownerReferences")):
        ref = raw if type(raw) is dict else _map(raw, where, f".metadata.ownerReferences[{i}]")
        if ref.get("controller") is True:
            field = f".metadata.ownerReferences[{i}]"
            kind = _str(ref.get("kind"), where, f"{field}.kind")
            return kind, _str(ref.get("uid"), where, f"{field}.uid")
    return "", ""


#: Volumes that tie a pod to no node: any node can mount them for a replacement.
_PORTABLE_VOLUMES: Final = frozenset(
    {"configMap", "secret", "downwardAPI", "projected", "emptyDir", "name"}
)


def _unknown_placement(spec: Obj, affinity: Obj) -> str:
    """Why a replacement's node cannot be judged from the node alone; empty if it can."""
    if affinity.get("podAffinity") or affinity.get("podAntiAffinity"):
        return "inter-pod affinity"
    if spec.get("topologySpreadConstraints"):
        return "topology spread constraints"
    for raw in spec.get("volumes") or ():
        if isinstance(raw, dict) and not raw.keys() <= _PORTABLE_VOLUMES:
            return "volumes"
    return ""


def _requirements(value: object, where: str, *, field: bool) -> tuple[NodeRequirement, ...]:
    out = []
    for i, raw in enumerate(_list(value, where)):
        expr = _map(raw, f"{where}[{i}]")
        values = _list(expr.get("values"), f"{where}[{i}].values")
        out.append(
            NodeRequirement(
                key=_str(expr.get("key"), f"{where}[{i}].key"),
                operator=_str(expr.get("operator"), f"{where}[{i}].operator"),
                values=tuple(_str(v, f"{where}[{i}].values") for v in values),
                field=field,
            )
        )
    return tuple(out)


def _terms(affinity: Obj, where: str) -> tuple[tuple[NodeRequirement, ...], ...]:
    """Required node affinity's ``nodeSelectorTerms``."""
    node = _map(affinity.get("nodeAffinity"), where, ".nodeAffinity")
    required = _map(
        node.get("requiredDuringSchedulingIgnoredDuringExecution"),
        where,
        ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
    )
    terms = []
    for i, raw in enumerate(_list(required.get("nodeSelectorTerms"), where, ".nodeSelectorTerms")):
        term = _map(raw, where, f".nodeSelectorTerms[{i}]")
        at = f"{where}.nodeSelectorTerms[{i}]"
        terms.append(
            _requirements(term.get("matchExpressions"), f"{at}.matchExpressions", field=False)
            + _requirements(term.get("matchFields"), f"{at}.matchFields", field=True)
        )
    return tuple(terms)


def _placement(spec: Obj, where: str) -> Placement:
    """What of ``spec`` constrains the node a replacement of the pod could run on."""
    selector, raw_affinity = spec.get("nodeSelector"), spec.get("affinity")
    tolerations, topology, volumes = (
        spec.get("tolerations"),
        spec.get("topologySpreadConstraints"),
        spec.get("volumes"),
    )
    if not (selector or raw_affinity or tolerations or topology or volumes):
        return ANYWHERE
    affinity = _map(raw_affinity, where, ".spec.affinity")
    placement = Placement(
        node_selector=()
        if selector is None
        else tuple(sorted(_labels(selector, where, ".spec.nodeSelector").items())),
        terms=_terms(affinity, f"{where}.spec.affinity") if affinity else (),
        tolerations=tuple(
            Toleration(
                key=_str(t.get("key"), where, ".spec.tolerations.key"),
                operator=_str(t.get("operator"), where, ".spec.tolerations.operator"),
                value=_str(t.get("value"), where, ".spec.tolerations.value"),
                effect=_str(t.get("effect"), where, ".spec.tolerations.effect"),
            )
            for t in (
                raw if type(raw) is dict else _map(raw, where, f".spec.tolerations[{i}]")
                for i, raw in enumerate(_list(tolerations, where, ".spec.tolerations"))
            )
        ),
        unknown=_unknown_placement(spec, affinity),
    )
    return ANYWHERE if placement == ANYWHERE else placement


def parse_floors(text: str, spec: Obj) -> tuple[tuple[Floor, ...], str]:
    """The floors of :data:`FLOOR_ANNOTATION` ``text`` on a pod of ``spec``, and ``""``;
    or no floors and why the annotation cannot be used.

    A malformed annotation never fails anything: the pod simply does not lend. A floor of
    a resource whose ``resizePolicy`` is ``RestartContainer`` is left out, not an error:
    lowering it would restart the container, a disruption its owner did not agree to.
    """
    where = f"annotation {FLOOR_ANNOTATION}"
    try:
        raw = json.loads(text)
    except ValueError:
        return (), f"{where} is not valid JSON"
    if not isinstance(raw, dict):
        return (), f'{where} must be a JSON object like {{"app": {{"cpu": "1"}}}}'
    resizable: dict[str, Obj] = {}
    try:
        for i, c in enumerate(_list(spec.get("initContainers"), "spec", ".initContainers")):
            c = _map(c, "spec", f".initContainers[{i}]")
            if c.get("restartPolicy") == "Always":
                resizable[_str(c.get("name"), "spec", f".initContainers[{i}].name")] = c
        for i, c in enumerate(_list(spec.get("containers"), "spec", ".containers")):
            c = _map(c, "spec", f".containers[{i}]")
            resizable[_str(c.get("name"), "spec", f".containers[{i}].name")] = c
        floors: list[Floor] = []
        for name, c in resizable.items():
            amounts = raw.get(name)
            if amounts is None:
                continue
            if not isinstance(amounts, dict) or set(amounts) - set(RESOURCE_NAMES):
                return (), f"{where}: {name!r} must map cpu and/or memory to quantities"
            restarts = _restarting(c.get("resizePolicy"))
            for resource in RESOURCE_NAMES:
                value = amounts.get(resource)
                if value is None:
                    continue
                parse = cpu_millis if resource == "cpu" else memory_bytes
                amount = parse(value, where=where, field=f".{name}", name=f".{resource}")
                if amount <= 0:
                    # A request lowered to zero could turn a Burstable pod BestEffort.
                    return (), f"{where}: {name}.{resource} must be more than 0"
                if resource not in restarts:
                    floors.append(Floor(name, resource, amount))
    except InputError as e:
        return (), str(e)
    unknown = sorted(set(raw) - set(resizable))
    if unknown:
        return (), f"{where}: no container (or sidecar) named {unknown[0]!r} can be resized"
    return tuple(floors), ""


def _restarting(policy: object) -> frozenset[str]:
    """Resources whose ``resizePolicy`` restarts the container (``NotRequired`` default)."""
    return frozenset(
        str(p.get("resourceName"))
        for p in _list(policy, "spec", ".resizePolicy")
        if isinstance(p, dict) and p.get("restartPolicy") == "RestartContainer"
    )


def _declared(
    spec: Obj, where: str
) -> tuple[tuple[Container, ...], tuple[Container, ...], Resources, Resources]:
    """What a pod declares and a resize may change: (containers, init containers, pod-level
    requests, pod-level limits)."""
    containers = tuple(
        _container(c, f"{where}.spec.containers[{i}]", init=False)
        for i, c in enumerate(_list(spec.get("containers"), where, ".spec.containers"))
    )
    raw_init = spec.get("initContainers")
    init_containers = (
        tuple(
            _container(c, f"{where}.spec.initContainers[{i}]", init=True)
            for i, c in enumerate(_list(raw_init, where, ".spec.initContainers"))
        )
        if raw_init is not None
        else ()
    )
    pod_resources = spec.get("resources")
    if pod_resources is None:
        return containers, init_containers, ZERO, ZERO
    pod_resources = _map(pod_resources, where, ".spec.resources")
    return (
        containers,
        init_containers,
        parse_resources(pod_resources.get("requests"), where, ".spec.resources.requests"),
        parse_resources(pod_resources.get("limits"), where, ".spec.resources.limits"),
    )


def parse_node(obj: Obj) -> Node:
    """A Node object -> :class:`Node`."""
    meta = _map(obj.get("metadata"), "node.metadata")
    name = _str(meta.get("name"), "node.metadata.name")
    if not name:
        raise ObjectError("node: metadata.name is missing")
    where = f"node {name}"
    spec = _map(obj.get("spec"), f"{where}.spec")
    status = _map(obj.get("status"), f"{where}.status")
    policy = _map(spec.get("podPreemptionPolicy"), f"{where}.spec.podPreemptionPolicy")
    annotations = _labels(meta.get("annotations"), f"{where}.metadata.annotations")
    allocatable_raw = status.get("allocatable")
    if allocatable_raw is None:
        allocatable_raw = status.get("capacity")
    return Node(
        name=name,
        allocatable=parse_resources(allocatable_raw, f"{where}.status.allocatable"),
        labels=_labels(meta.get("labels"), f"{where}.metadata.labels"),
        resize_preemption_disabled=bool(policy.get("disableResizePreemption"))
        or bool(annotations.get(NODE_OPT_OUT_ANNOTATION)),
        taints=tuple(
            Taint(
                key=_str(t.get("key"), f"{where}.spec.taints.key"),
                value=_str(t.get("value"), f"{where}.spec.taints.value"),
                effect=_str(t.get("effect"), f"{where}.spec.taints.effect"),
            )
            for t in (
                _map(raw, f"{where}.spec.taints[{i}]")
                for i, raw in enumerate(_list(spec.get("taints"), f"{where}.spec.taints"))
            )
        ),
        unschedulable=spec.get("unschedulable") is True,
        ready=_ready(status, where),
    )


def _ready(status: Obj, where: str) -> bool:
    """The node's ``Ready`` condition is True; a node reporting none counts as ready."""
    for i, raw in enumerate(_list(status.get("conditions"), f"{where}.status.conditions")):
        cond = _map(raw, f"{where}.status.conditions[{i}]")
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


def parse_selector(value: object, where: str) -> LabelSelector | None:
    """A ``metav1.LabelSelector``; ``None`` for a null selector."""
    if value is None:
        return None
    raw = _map(value, where)
    match_labels = tuple(sorted(_labels(raw.get("matchLabels"), f"{where}.matchLabels").items()))
    expressions = []
    for i, e in enumerate(_list(raw.get("matchExpressions"), f"{where}.matchExpressions")):
        expr = _map(e, f"{where}.matchExpressions[{i}]")
        op = expr.get("operator")
        if op not in _OPERATORS:
            raise ObjectError(f"{where}.matchExpressions[{i}].operator: unknown {op!r}")
        values = _list(expr.get("values"), f"{where}.matchExpressions[{i}].values")
        expressions.append(
            Requirement(
                key=_str(expr.get("key"), f"{where}.matchExpressions[{i}].key"),
                operator=op,
                values=frozenset(_str(v, f"{where}.matchExpressions[{i}].values") for v in values),
            )
        )
    return LabelSelector(match_labels, tuple(expressions))


def parse_pdb(obj: Obj) -> DisruptionBudget:
    """A PodDisruptionBudget (policy/v1) -> :class:`DisruptionBudget`."""
    meta = _map(obj.get("metadata"), "pdb.metadata")
    namespace = _str(meta.get("namespace"), "pdb.metadata.namespace", default="default")
    name = _str(meta.get("name"), "pdb.metadata.name")
    where = f"PodDisruptionBudget {namespace}/{name}"
    spec = _map(obj.get("spec"), f"{where}.spec")
    status = _map(obj.get("status"), f"{where}.status")
    disrupted = _map(status.get("disruptedPods"), f"{where}.status.disruptedPods")
    return DisruptionBudget(
        namespace=namespace,
        name=name,
        selector=parse_selector(spec.get("selector"), f"{where}.spec.selector"),
        disruptions_allowed=_int(
            status.get("disruptionsAllowed"), f"{where}.status.disruptionsAllowed"
        ),
        disrupted_pods=frozenset(disrupted),
    )


def parse_namespace(obj: Obj) -> Namespace:
    """A Namespace (v1) -> :class:`Namespace`: its name and labels."""
    meta = _map(obj.get("metadata"), "namespace.metadata")
    name = _str(meta.get("name"), "namespace.metadata.name")
    labels = meta.get("labels")
    where = f"Namespace {name}"
    return Namespace(name, {} if labels is None else _labels(labels, where, ".labels"))


def parse_priority_class(obj: Obj) -> PriorityClass:
    """A PriorityClass (scheduling.k8s.io/v1) -> :class:`PriorityClass`."""
    meta = _map(obj.get("metadata"), "priorityclass.metadata")
    name = _str(meta.get("name"), "priorityclass.metadata.name")
    where = f"PriorityClass {name}"
    policy = obj.get("preemptionPolicy") or "PreemptLowerPriority"
    if policy not in ("PreemptLowerPriority", NEVER):
        raise ObjectError(f"{where}.preemptionPolicy: unknown value {policy!r}")
    return PriorityClass(
        name=name,
        value=_int(obj.get("value"), f"{where}.value"),
        global_default=bool(obj.get("globalDefault")),
        preemption_policy=cast(PreemptionPolicyName, policy),
    )


__all__ = [
    "ZERO",
    "PriorityResolver",
    "parse_floors",
    "parse_namespace",
    "parse_node",
    "parse_pdb",
    "parse_pod",
    "parse_priority_class",
    "parse_resources",
    "parse_selector",
    "parse_time",
]
