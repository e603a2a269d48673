"""Node headroom: allocatable minus what the other pods hold minus reservations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from webhook.core.accounting import pod_requests
from webhook.core.model import TERMINAL_PHASES, Node, Pod, PodRef
from webhook.core.reservation import Reservation
from webhook.core.resources import Resources


@dataclass(frozen=True, slots=True)
class NodeUsage:
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
) -> NodeUsage:
    """Usage of ``node`` by every pod but ``exclude_uid`` (the resizing pod).

    ``pods`` are the pods bound to the node; ``reservations`` the active ones on it by pod
    uid, without the resizing pod's own.
    """
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
