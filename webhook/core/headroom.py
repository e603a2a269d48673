"""Node headroom: allocatable minus what the other pods hold minus reservations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from webhook.core.accounting import pod_requests
from webhook.core.model import Node, Pod, PodRef
from webhook.core.reservation import Reservation
from webhook.core.resources import ZERO, Resources


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
    in_use = reserved = freeing = ZERO
    held_by: dict[str, Resources] = {}
    waiting: list[PodRef] = []
    for pod in pods:
        if pod.uid == exclude_uid or pod.terminal or pod.node != node.name:
            continue
        usage = pod_requests(pod, "other")
        held = usage
        reservation = reservations.get(pod.uid)
        if reservation is not None:
            held = usage.max(reservation.resources)
            reserved = reserved + (held - usage)
        in_use = in_use + held
        held_by[pod.uid] = held
        if pod.terminating or pod.uid in claimed:
            freeing = freeing + usage
            waiting.append(pod.ref)
    for uid, reservation in reservations.items():
        if uid not in held_by and uid != exclude_uid:
            in_use = in_use + reservation.resources
            reserved = reserved + reservation.resources
    waiting.sort(key=lambda ref: (ref.namespace, ref.name))
    return NodeUsage(node.allocatable, in_use, reserved, freeing, tuple(waiting), held_by)
