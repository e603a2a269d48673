"""What a node's pods hold: each pod by the kubelet's model, the room promised to
admitted resizes (reservations), and the two together as one resize sees them (node usage).

**What a pod holds.** This is component-helpers' ``resource.PodRequests`` with
``UseStatusResources`` (k8s.io/component-helpers v0.37.2, ``resource/helpers.go``), the
function both the kubelet's admission check and kube-scheduler call. Per container there
are three amounts - the desired spec, the allocation (``allocatedResources``) and the
actuated requests (``resources.requests``) - each aggregated over the pod on its own,
and the pod counts at the per-resource maximum of the three *aggregates* (not the sum of
per-container maxima: moving CPU from one container to another needs no room).

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

**Reservations**: room promised to resizes already admitted but not yet actuated.
Between the webhook's answer and the kubelet actuating the resize, the node's pods do not
yet show the new size. Without a reservation, two resizes admitted a millisecond apart
would both see the same free room. A reservation holds the resizing pod's full new
requests (not a delta, so it never double counts once the kubelet catches up) and names
the victims the plan claimed, whose capacity is therefore already spoken for. It holds
room until it expires (``expires_at``) or the cluster shows that it holds nothing any
more; the admitted resize's lifecycle judges the latter (``webhook.engine.lifecycle``),
and only reservations still holding room reach a plan.

**Node usage.** What the node's pods hold (:func:`holdings`) depends on the pods alone;
the usage one resize sees (:func:`node_usage`) leaves the resizing pod out and adds the
reservations. A caller deciding many resizes on the same pods keeps the first between
decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from webhook.core.model import Container, Node, Pod, PodRef
from webhook.core.resources import ZERO, Resources, total

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


@dataclass(frozen=True, slots=True)
class Reservation:
    """Room on ``node`` held for pod ``pod_uid`` until ``expires_at`` (epoch seconds)."""

    pod_uid: str
    pod: str  # "namespace/name", for messages
    node: str
    resources: Resources
    victims: frozenset[str] = frozenset()  # victim pod uids claimed by the plan
    expires_at: float = 0.0
    #: Room on other nodes promised to the replacements of movable victims: (node, what
    #: the replacement asks for), so that no other plan counts on it too.
    moves: tuple[tuple[str, Resources], ...] = ()

    def active(self, now: float) -> bool:
        return now < self.expires_at


def _move_order(move: tuple[str, Resources]) -> tuple[str, int, int]:
    """Promises in a total order (amounts have none): by node, then amount."""
    node, needs = move
    return (node, needs.cpu, needs.memory)


def active_on(
    reservations: Iterable[Reservation], node: str, now: float, *, exclude_pod: str = ""
) -> dict[str, Reservation]:
    """Active reservations on ``node`` by pod uid, leaving out ``exclude_pod``'s own.

    Reservations that hold nothing any more must be left out by the caller (that needs the
    cached pods, which the ledger's readers have); expired ones are left out here.

    Several active reservations of one pod (a later resize admitted before the earlier
    one's entry went) merge into one holding the most room and every claimed victim, so
    the result does not depend on the order they come in.
    """
    by_pod: dict[str, Reservation] = {}
    for r in reservations:
        if r.node != node or r.pod_uid == exclude_pod or not r.active(now):
            continue
        seen = by_pod.get(r.pod_uid)
        if seen is not None:
            r = Reservation(
                pod_uid=r.pod_uid,
                pod=min(seen.pod, r.pod),
                node=node,
                resources=seen.resources.max(r.resources),
                victims=seen.victims | r.victims,
                expires_at=max(seen.expires_at, r.expires_at),
                moves=tuple(sorted(set(seen.moves) | set(r.moves), key=_move_order)),
            )
        by_pod[r.pod_uid] = r
    return by_pod


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """What a node's other pods hold, seen from one resizing pod.

    ``in_use`` counts every pod bound to the node and not terminal, at the kubelet's model,
    raised to its reservation where it has one, plus reservations of pods not (yet) seen
    on the node. ``freeing`` is the part of ``in_use`` already on its way out: pods
    terminating, and victims other admitted resizes claimed. It is counted as free for
    planning (so we never preempt twice for the same room) but not for the kubelet's
    check now.
    """

    allocatable: Resources
    in_use: Resources
    freeing: Resources
    waiting_for: tuple[PodRef, ...]
    #: What each counted pod holds, by uid (its usage, raised to its reservation).
    held: Mapping[str, Resources]


@dataclass(frozen=True, slots=True)
class Holdings:
    """What the pods bound to a node hold there, before reservations: of every pod bound
    to it and not terminal, by uid, at the kubelet's model (:func:`holdings`)."""

    held: Mapping[str, Resources]
    total: Resources  # of every amount in held
    pods: Mapping[str, Pod]
    terminating: tuple[Pod, ...]
    #: What each pod's spec asks for now, by uid, as :meth:`asks` reads it.
    _asks: dict[str, Resources] = field(default_factory=dict, compare=False, repr=False)

    def asks(self, pod: Pod) -> Resources:
        """What ``pod`` (one of :attr:`pods`) asks for now, as a new pod of its spec
        would: ``pod_requests(pod, "resizing")``, read once per pod however many
        decisions on these pods ask."""
        if self.pods.get(pod.uid) is not pod:
            return pod_requests(pod, "resizing")
        found = self._asks.get(pod.uid)
        if found is None:
            found = self._asks[pod.uid] = pod_requests(pod, "resizing")
        return found


def holdings(
    node: Node, pods: Iterable[Pod], holds: Callable[[Pod], Resources] = pod_requests
) -> Holdings:
    """What ``pods`` hold on ``node`` (pods bound elsewhere and terminal ones are left
    out): ``holds(pod)`` (``pod_requests`` unless a caller counts pods otherwise), as
    :func:`~webhook.core.accounting.holds_on` a node of that size."""
    on_node = {p.uid: p for p in pods if p.node == node.name and not p.terminal}
    held = {uid: holds_on(p, holds(p), node.allocatable) for uid, p in on_node.items()}
    return Holdings(
        held=held,
        total=total(held.values()),
        pods=on_node,
        terminating=tuple(p for p in on_node.values() if p.terminating),
    )


def node_usage(
    node: Node,
    pods: Iterable[Pod],
    reservations: Mapping[str, Reservation],
    *,
    exclude_uid: str,
    kept: Holdings | None = None,
) -> NodeUsage:
    """Usage of ``node`` by every pod but ``exclude_uid`` (the resizing pod).

    ``pods`` are the pods bound to the node (others are skipped); ``reservations`` the
    active ones on it by pod uid, without the resizing pod's own. ``kept``, when given,
    must be ``holdings(node, pods)``: a caller deciding several resizes on the same pods
    keeps it between decisions.
    """
    kept = kept if kept is not None else holdings(node, pods)
    claimed = {uid for r in reservations.values() for uid in r.victims}
    held = dict(kept.held)  # what each pod holds, raised to its reservation
    in_use = kept.total - held.pop(exclude_uid, ZERO)
    for uid, reservation in reservations.items():
        amount = held.get(uid)
        if amount is not None:
            held[uid] = raised = amount.max(reservation.resources)
            in_use = in_use + raised - amount
        elif uid != exclude_uid:
            in_use = in_use + reservation.resources  # of a pod not seen on the node (yet)
    leaving = {p.uid: p for p in kept.terminating if p.uid in held}
    leaving.update((uid, kept.pods[uid]) for uid in claimed if uid in held)
    by_name = sorted(leaving.values(), key=lambda p: (p.namespace, p.name))
    return NodeUsage(
        allocatable=node.allocatable,
        in_use=in_use,
        # What they hold without reservations: a reservation is room not yet taken.
        freeing=total(kept.held[p.uid] for p in by_name),
        waiting_for=tuple(p.ref for p in by_name),
        held=held,
    )
