"""Node headroom: allocatable minus what the other pods hold minus reservations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from webhook.core.accounting import pod_requests
from webhook.core.model import TERMINAL_PHASES, Node, Pod, PodRef
from webhook.core.nodepods import HeldBy, NodePods
from webhook.core.reservation import Reservation
from webhook.core.resources import ZERO, Resources, tuple_new


class NodeUsage(NamedTuple):
    """What a node's other pods hold, seen from one resizing pod.

    ``in_use`` counts every non-terminal pod at the kubelet's model, raised to its
    reservation where it has one, plus reservations of pods not (yet) seen on the node.
    ``freeing`` is the part of ``in_use`` already on its way out: pods terminating, and
    victims other admitted resizes claimed. It is counted as free for planning (so we never
    preempt twice for the same room) but not for the kubelet's check now.
    """

    allocatable: Resources
    in_use: Resources
    reserved: Resources
    freeing: Resources
    waiting_for: tuple[PodRef, ...]
    #: What each counted pod holds, by uid (its usage, raised to its reservation).
    held: Mapping[str, Resources]

    @property
    def headroom(self) -> Resources:
        """Room left once everything on its way out has gone (may be negative)."""
        return self.allocatable - self.in_use + self.freeing


def node_usage(
    node: Node,
    pods: Iterable[Pod],
    reservations: Mapping[str, Reservation],
    *,
    exclude_uid: str,
    index: NodePods | None = None,
) -> NodeUsage:
    """Usage of ``node`` by every pod but ``exclude_uid`` (the resizing pod).

    ``pods`` are the pods bound to the node; ``reservations`` the active ones on it by pod
    uid, without the resizing pod's own. ``index``, if given, is ``NodePods`` of the same
    node and pods: the same answer, without walking every pod.
    """
    if index is not None and index.exact and index.node == node.name:
        return _indexed_usage(node, index, reservations, exclude_uid)
    claimed: set[str] = set()
    for r in reservations.values():
        claimed |= r.victims
    name = node.name
    # Plain integers in the loop: it runs for every pod on the node in every decision.
    in_cpu = in_memory = reserved_cpu = reserved_memory = free_cpu = free_memory = 0
    held_by: dict[str, Resources] = {}
    waiting: list[PodRef] = []
    for pod in pods:
        uid = pod.uid
        if uid == exclude_uid or pod.node != name or pod.phase in TERMINAL_PHASES:
            continue
        usage = pod_requests(pod, "other")
        held = usage
        if reservations:
            reservation = reservations.get(uid)
            if reservation is not None:
                held = usage.max(reservation.resources)
                reserved_cpu += held.cpu - usage.cpu
                reserved_memory += held.memory - usage.memory
        in_cpu += held.cpu
        in_memory += held.memory
        held_by[uid] = held
        if pod.terminating or uid in claimed:
            free_cpu += usage.cpu
            free_memory += usage.memory
            waiting.append(pod.ref)
    for uid, reservation in reservations.items():
        if uid not in held_by and uid != exclude_uid:
            in_cpu += reservation.resources.cpu
            in_memory += reservation.resources.memory
            reserved_cpu += reservation.resources.cpu
            reserved_memory += reservation.resources.memory
    waiting.sort(key=lambda ref: (ref.namespace, ref.name))
    return NodeUsage(
        node.allocatable,
        Resources(in_cpu, in_memory),
        Resources(reserved_cpu, reserved_memory),
        Resources(free_cpu, free_memory),
        tuple(waiting),
        held_by,
    )


def _indexed_usage(
    node: Node, index: NodePods, reservations: Mapping[str, Reservation], exclude_uid: str
) -> NodeUsage:
    """:func:`node_usage` from the index's totals, adjusted for the few pods that differ."""
    in_use, freeing, waiting = index.usage_parts(exclude_uid)
    if not reservations:
        # The usual case: nothing reserved on the node, the totals are the answer.
        if waiting:
            waiting.sort(key=lambda ref: (ref.namespace, ref.name))
        return tuple_new(
            NodeUsage,
            (
                node.allocatable,
                in_use,
                ZERO,
                freeing,
                tuple(waiting),
                HeldBy(index.held, exclude_uid),
            ),
        )
    in_cpu, in_memory = in_use.cpu, in_use.memory
    free_cpu, free_memory = freeing.cpu, freeing.memory
    reserved_cpu = reserved_memory = 0
    base, by_uid = index.held, index.by_uid
    raised: dict[str, Resources] = {}
    claimed: set[str] = set()
    for uid, reservation in reservations.items():
        claimed |= reservation.victims
        if uid == exclude_uid:
            continue
        amount = reservation.resources
        usage = base.get(uid)
        if usage is None:
            in_cpu += amount.cpu
            in_memory += amount.memory
            reserved_cpu += amount.cpu
            reserved_memory += amount.memory
            continue
        held = usage.max(amount)
        raised[uid] = held
        in_cpu += held.cpu - usage.cpu
        in_memory += held.memory - usage.memory
        reserved_cpu += held.cpu - usage.cpu
        reserved_memory += held.memory - usage.memory
    for uid in claimed:
        pod = by_uid.get(uid)
        if pod is None or uid == exclude_uid or pod.terminating:
            continue  # not counted here, or already among the leaving
        usage = base[uid]
        free_cpu += usage.cpu
        free_memory += usage.memory
        waiting.append(pod.ref)
    waiting.sort(key=lambda ref: (ref.namespace, ref.name))
    return tuple_new(
        NodeUsage,
        (
            node.allocatable,
            tuple_new(Resources, (in_cpu, in_memory)),
            tuple_new(Resources, (reserved_cpu, reserved_memory)),
            tuple_new(Resources, (free_cpu, free_memory)),
            tuple(waiting),
            HeldBy(base, exclude_uid, raised),
        ),
    )
