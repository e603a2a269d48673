"""Node usage: what the other pods and the reservations hold on a node."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from webhook.core.accounting import holds_on, pod_requests
from webhook.core.model import Node, Pod, PodRef
from webhook.core.reservation import Reservation
from webhook.core.resources import Resources, total


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


def node_usage(
    node: Node,
    pods: Iterable[Pod],
    reservations: Mapping[str, Reservation],
    *,
    exclude_uid: str,
    holds: Callable[[Pod], Resources] = pod_requests,
) -> NodeUsage:
    """Usage of ``node`` by every pod but ``exclude_uid`` (the resizing pod).

    ``pods`` are the pods bound to the node (others are skipped); ``reservations`` the
    active ones on it by pod uid, without the resizing pod's own. ``holds(pod)`` must be
    ``pod_requests(pod)``; a caller that keeps those amounts between decisions passes
    its lookup.
    """
    claimed = {uid for r in reservations.values() for uid in r.victims}
    own: dict[str, Resources] = {}  # what each pod holds, before reservations
    held: dict[str, Resources] = {}
    leaving: list[Pod] = []
    for pod in pods:
        if pod.uid == exclude_uid or pod.node != node.name or pod.terminal:
            continue
        own[pod.uid] = amount = holds_on(pod, holds(pod), node.allocatable)
        reservation = reservations.get(pod.uid)
        held[pod.uid] = amount if reservation is None else amount.max(reservation.resources)
        if pod.terminating or pod.uid in claimed:
            leaving.append(pod)
    unseen = [r.resources for u, r in reservations.items() if u not in held and u != exclude_uid]
    leaving.sort(key=lambda p: (p.namespace, p.name))
    return NodeUsage(
        allocatable=node.allocatable,
        in_use=total(held.values()) + total(unseen),
        # What they hold without reservations: a reservation is room not yet taken.
        freeing=total(own[p.uid] for p in leaving),
        waiting_for=tuple(p.ref for p in leaving),
        held=held,
    )
