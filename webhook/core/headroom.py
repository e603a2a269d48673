"""Node usage: what the other pods and the reservations hold on a node.

What the node's pods hold (:func:`holdings`) depends on the pods alone; the usage one
resize sees (:func:`node_usage`) leaves the resizing pod out and adds the reservations.
A caller deciding many resizes on the same pods keeps the first between decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from webhook.core.accounting import holds_on, pod_requests
from webhook.core.model import Node, Pod, PodRef
from webhook.core.reservation import Reservation
from webhook.core.resources import ZERO, Resources, total


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
