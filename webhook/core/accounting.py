"""How much of a node a pod holds, by the kubelet's model.

The aggregation is component-helpers' ``resource.PodRequests``; what goes into it per
container depends on the pod's role:

* the **resizing** pod counts at ``max(desired, allocated, actual)`` per container - the
  kubelet must fit the new size while the old one may still be applied;
* **every other** pod counts at ``max(allocated, actual)``: the kubelet ignores another
  pod's desired size until it has admitted it. (kube-scheduler counts desired too and may
  over-preempt; this is where we do better.)

A container without status (the pod has not started) counts at its spec.
"""

from __future__ import annotations

from typing import Literal

from webhook.core.model import Container, ContainerStatus, Pod
from webhook.core.resources import ZERO, Resources, tuple_new

Role = Literal["resizing", "other"]


def _effective(spec: Resources, status: ContainerStatus | None, role: Role) -> Resources:
    observed: Resources | None = None
    if status is not None:
        for amount in (status.allocated, status.actual):
            if amount is not None:
                observed = amount if observed is None else observed.max(amount)
    if observed is None:
        return spec
    return observed.max(spec) if role == "resizing" else observed


def container_requests(pod: Pod, container: Container, role: Role) -> Resources:
    """One container's requests as the kubelet counts them for ``role``.

    Init containers that are not sidecars have run to completion; like PodRequests, they
    count at their spec.
    """
    if container in pod.init_containers and not container.sidecar:
        return container.requests
    return _effective(container.requests, pod.statuses.get(container.name), role)


def aggregate(pod: Pod, per_container: dict[str, Resources]) -> Resources:
    """component-helpers ``PodRequests`` over given per-container amounts.

    The larger of (app containers + sidecars) and, for each init container, its own
    request plus the sidecars started before it; pod-level requests replace the
    container aggregate where set; then ``spec.overhead`` on top.
    """
    app = ZERO
    for c in pod.containers:
        app = app + per_container[c.name]
    sidecars = ZERO
    init_peak = ZERO
    for c in pod.init_containers:
        amount = per_container[c.name]
        if c.sidecar:
            app = app + amount
            sidecars = sidecars + amount
            init_peak = init_peak.max(sidecars)
        else:
            init_peak = init_peak.max(amount + sidecars)
    total = app.max(init_peak)
    if pod.pod_requests.cpu:
        total = total.replace("cpu", pod.pod_requests.cpu)
    if pod.pod_requests.memory:
        total = total.replace("memory", pod.pod_requests.memory)
    return total + pod.overhead


def _pod_level(pod: Pod, role: Role) -> Pod:
    """Apply the role's status rule to pod-level requests as well."""
    if pod.pod_requests.is_zero():
        return pod
    status = ContainerStatus("", pod.pod_allocated, pod.pod_actual)
    effective = _effective(pod.pod_requests, status, role)
    # Only the resources the pod sets at pod level replace the container aggregate.
    keep = Resources(
        effective.cpu if pod.pod_requests.cpu else 0,
        effective.memory if pod.pod_requests.memory else 0,
    )
    return pod.with_pod_resources(keep, pod.pod_limits)


def _observed_pair(
    spec: Resources, status: ContainerStatus | None, resizing: bool
) -> tuple[int, int]:
    """:func:`_effective` on plain integers (the hot path of :func:`pod_requests`)."""
    if status is None:
        return spec.cpu, spec.memory
    allocated, actual = status.allocated, status.actual
    if allocated is None:
        if actual is None:
            return spec.cpu, spec.memory
        cpu, memory = actual.cpu, actual.memory
    elif actual is None:
        cpu, memory = allocated.cpu, allocated.memory
    else:
        cpu = allocated.cpu if allocated.cpu > actual.cpu else actual.cpu
        memory = allocated.memory if allocated.memory > actual.memory else actual.memory
    if resizing:
        if spec.cpu > cpu:
            cpu = spec.cpu
        if spec.memory > memory:
            memory = spec.memory
    return cpu, memory


def pod_requests(pod: Pod, role: Role = "other") -> Resources:
    """What ``pod`` holds on its node (role ``other``) or needs there (role ``resizing``).

    For a resizing pod whose resize the kubelet marked Infeasible, call with role
    ``other``: the kubelet ignores an infeasible desired size.

    Same result as ``aggregate(_pod_level(pod, role), {name: container_requests(...)})``,
    computed on plain integers: it runs for every pod on the node in every decision, so
    the ``other`` amount is also memoized on the (immutable) pod.
    """
    if role == "resizing":
        return _requests(pod, True)
    held = pod._held
    if held is None:
        held = _requests(pod, False)
        object.__setattr__(pod, "_held", held)
    return held


def _requests(pod: Pod, resizing: bool) -> Resources:
    statuses = pod.statuses
    cpu = memory = 0
    for c in pod.containers:
        c_cpu, c_memory = _observed_pair(c.requests, statuses.get(c.name), resizing)
        cpu += c_cpu
        memory += c_memory
    if pod.init_containers:
        side_cpu = side_memory = peak_cpu = peak_memory = 0
        for c in pod.init_containers:
            if c.sidecar:
                c_cpu, c_memory = _observed_pair(c.requests, statuses.get(c.name), resizing)
                cpu += c_cpu
                memory += c_memory
                side_cpu += c_cpu
                side_memory += c_memory
                c_cpu, c_memory = side_cpu, side_memory
            else:
                c_cpu = c.requests.cpu + side_cpu
                c_memory = c.requests.memory + side_memory
            if c_cpu > peak_cpu:
                peak_cpu = c_cpu
            if c_memory > peak_memory:
                peak_memory = c_memory
        if peak_cpu > cpu:
            cpu = peak_cpu
        if peak_memory > memory:
            memory = peak_memory
    level = pod.pod_requests
    if level.cpu or level.memory:
        status = ContainerStatus("", pod.pod_allocated, pod.pod_actual)
        level_cpu, level_memory = _observed_pair(level, status, resizing)
        # Only the resources the pod sets at pod level replace the container aggregate.
        if level.cpu and level_cpu:
            cpu = level_cpu
        if level.memory and level_memory:
            memory = level_memory
    overhead = pod.overhead
    return tuple_new(Resources, (cpu + overhead.cpu, memory + overhead.memory))


def declared_requests(pod: Pod) -> Resources:
    """The pod's requests from its spec alone (what a scheduler would see)."""
    return aggregate(pod, {c.name: c.requests for c in pod.all_containers()})
