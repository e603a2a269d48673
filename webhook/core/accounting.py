"""How much of a node a pod holds, by the kubelet's model.

This is component-helpers' ``resource.PodRequests`` with ``UseStatusResources``
(k8s.io/component-helpers v0.37.2, ``resource/helpers.go``), the function both the
kubelet's admission check and kube-scheduler call. Per container there are three amounts
- the desired spec, the allocation (``allocatedResources``) and the actuated requests
(``resources.requests``) - each aggregated over the pod on its own, and the pod counts at
the per-resource maximum of the three *aggregates* (not the sum of per-container maxima:
moving CPU from one container to another needs no room).

What goes in depends on the pod's role (:data:`Role`):

* ``resizing``: the pod whose resize is decided, at max(spec, allocated, actual);
* ``infeasible``: the same pod when the kubelet marked its resize Infeasible and the
  request leaves it so: the desired spec is ignored (upstream's Infeasible rule);
* ``other``: every other pod, as the kubelet counts an admitted pod - its spec replaced by
  its allocation (``UpdatePodFromAllocation``), so at max(allocated, actual). The kubelet
  ignores another pod's desired size until it has admitted it; kube-scheduler counts it
  too and may over-preempt. This is where we do better.

A container without status counts at its spec.

**Pods the kubelet has not admitted.** The kubelet's fit check counts only pods that have
an allocation (``getAllocatedPods`` in ``pkg/kubelet/allocation/allocation_manager.go``).
A pod bound to the node but not admitted yet shows no container status and no pod-level
allocation (:func:`admitted`). Two cases, by what the kubelet will do when it sees it:

* its requests alone exceed the node's allocatable: admission (``canAdmitPod``) will
  reject it, so it never holds anything, and counts as nothing (:func:`holds_on`);
* otherwise it counts at its spec. The kubelet takes pods and their updates in the order
  they reach it: a pod bound before the resize is admitted (``HandlePodAdditions`` ->
  ``AddPod``, against the allocated pods) before the resize is handled
  (``HandlePodUpdates`` -> ``RetryPendingResizes``), so it takes its room first. Leaving
  it out would plan a resize the kubelet then defers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from webhook.core.model import Container, Pod
from webhook.core.resources import ZERO, Resources

Role = Literal["resizing", "infeasible", "other"]


def aggregate(pod: Pod, amount: Callable[[Container], Resources | None]) -> Resources:
    """``aggregateContainerResourcesByFn``: app containers and sidecars add up; each
    init container needs its own amount plus the sidecars started before it; the pod
    needs the larger of the two. ``None`` (upstream's nil list) counts as nothing."""
    app = ZERO
    for c in pod.containers:
        app = app + (amount(c) or ZERO)
    sidecars = ZERO
    init_peak = ZERO
    for c in pod.init_containers:
        own = amount(c) or ZERO
        if c.sidecar:
            app = app + own
            sidecars = sidecars + own
            init_peak = init_peak.max(sidecars)
        else:
            init_peak = init_peak.max(own + sidecars)
    return app.max(init_peak)


def pod_requests(pod: Pod, role: Role = "other") -> Resources:
    """What ``pod`` holds on its node (role ``other``) or needs there (``resizing``,
    ``infeasible``): upstream ``PodRequests`` with status resources, see the module."""
    infeasible = role == "infeasible"
    statuses = pod.statuses

    def spec(c: Container) -> Resources:
        status = statuses.get(c.name)
        if role == "other" and status is not None and status.allocated is not None:
            return status.allocated
        return c.requests

    def allocated(c: Container) -> Resources | None:
        status = statuses.get(c.name)
        if status is not None and status.allocated is not None:
            return status.allocated
        return None if infeasible else spec(c)

    def actual(c: Container) -> Resources | None:
        status = statuses.get(c.name)
        if status is not None and status.actual is not None:
            return status.actual
        if status is not None and status.allocated is not None:
            return status.allocated
        return None if infeasible else spec(c)

    # Pod-level status, when the kubelet reports both, already holds the aggregates.
    if pod.pod_allocated is not None and pod.pod_actual is not None:
        held = pod.pod_allocated.max(pod.pod_actual)
    else:
        held = aggregate(pod, allocated).max(aggregate(pod, actual))
    total = held if infeasible else held.max(aggregate(pod, spec))

    level = pod.pod_requests
    if not level.is_zero():
        if role == "other" and pod.pod_allocated is not None:
            level = pod.pod_allocated
        effective = level
        if pod.pod_actual is not None:
            effective = (ZERO if infeasible else level).max(pod.pod_actual)
            effective = effective.max(pod.pod_allocated or ZERO)
        # Pod-level amounts replace the container aggregate, resource by resource.
        total = Resources(
            effective.cpu if effective.cpu or level.cpu else total.cpu,
            effective.memory if effective.memory or level.memory else total.memory,
        )
    return total + pod.overhead


def container_held(pod: Pod, container: Container) -> Resources:
    """What one container holds now: its allocation or actuated requests, whichever is
    larger, or its spec before the kubelet reported either."""
    status = pod.statuses.get(container.name)
    if status is None or (status.allocated is None and status.actual is None):
        return container.requests
    return (status.allocated or ZERO).max(status.actual or ZERO)


def admitted(pod: Pod) -> bool:
    """Whether the kubelet has admitted ``pod``: it reports container statuses or a
    pod-level allocation only for pods it admitted."""
    return bool(pod.statuses) or pod.pod_allocated is not None


def holds_on(pod: Pod, held: Resources, allocatable: Resources) -> Resources:
    """What ``pod``, holding ``held`` by :func:`pod_requests`, holds on a node of
    ``allocatable``: nothing when it is not admitted and can never be (see the module)."""
    if not admitted(pod) and not held.fits_in(allocatable):
        return ZERO
    return held
