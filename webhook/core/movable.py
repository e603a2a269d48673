"""Room elsewhere: whether a victim's work moves to another node or is lost.

A candidate is *movable* when a controller will recreate it (:data:`RECREATED_BY`) and
another node that takes new pods has room for the replacement now. The rooms are plain
values (:class:`Room`), computed with the resizing node's accounting
(:func:`~webhook.core.accounting.node_usage`: ``PodRequests``, unadmitted pods, active
reservations); the caller (the cluster cache, a snapshot) supplies them.

Only the node decides here: its free requests, its labels against ``nodeSelector`` and
required node affinity, its taints against the pod's tolerations. Inter-pod affinity,
topology spread and volumes depend on other pods and on storage, so a pod with any of
them is never movable: unknown counts as lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from webhook.core.accounting import Holdings, Reservation, active_on, node_usage, pod_requests
from webhook.core.model import Node, Placement, Pod, Taint
from webhook.core.resources import ZERO, Resources

#: Controllers that create a new pod when one of theirs is evicted, somewhere the
#: scheduler picks. Not DaemonSet: its replacement is bound to the same node, where it
#: would take back the room just made. Kinds not listed (custom controllers) may or may
#: not recreate: unknown counts as lost.
RECREATED_BY: Final = frozenset({"ReplicaSet", "ReplicationController", "StatefulSet", "Job"})

#: Taints the node lifecycle controller sets for a node's conditions (not ready,
#: unreachable, cordoned, under pressure): such a node never counts as room, whatever
#: the pod tolerates (every pod tolerates not-ready and unreachable for a while).
CONDITION_TAINTS: Final = "node.kubernetes.io/"

_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, slots=True)
class Room:
    """What one node other than the resizing one has free now, and what a pod must
    match to be scheduled there."""

    node: str
    free: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True, slots=True)
class Move:
    """Whether a victim's replacement has a place: ``node`` has room for ``needs``."""

    movable: bool
    why: str
    node: str = ""
    needs: Resources = ZERO


def takes_pods(node: Node) -> bool:
    """Whether ``node`` may count as room: Ready, not cordoned, no condition taint."""
    return (
        node.ready
        and not node.unschedulable
        and not any(t.key.startswith(CONDITION_TAINTS) for t in node.taints)
    )


def room_on(
    node: Node,
    pods: Iterable[Pod],
    reservations: Iterable[Reservation],
    now: float,
    kept: Holdings | None = None,
) -> Room | None:
    """The room ``node`` has now for a new pod, counted as for a resize on it (its pods
    at the kubelet's model, raised to their reservations, plus reservations of pods not
    seen there yet), less the room other plans promised there to replacements of their
    victims; ``None`` when it takes no pods. ``reservations`` may be any node's;
    ``kept``, when given, must be ``holdings(node, pods)``."""
    if not takes_pods(node):
        return None
    reservations = tuple(reservations)
    reserved = active_on(reservations, node.name, now)
    usage = node_usage(node, pods, reserved, exclude_uid="", kept=kept)
    claimed = claims_on(reservations, node.name, now)
    free = (node.allocatable - usage.in_use - claimed).clamp()
    return Room(node.name, free, node.labels, node.taints)


def claims_on(reservations: Iterable[Reservation], node: str, now: float) -> Resources:
    """What active reservations promised on ``node`` to replacements of their victims."""
    claimed = ZERO
    for r in reservations:
        if r.active(now):
            for name, needs in r.moves:
                if name == node:
                    claimed = claimed + needs
    return claimed


def rooms_elsewhere(
    nodes: Iterable[Node],
    pods_on: Mapping[str, Sequence[Pod]],
    reservations: Sequence[Reservation],
    now: float,
    *,
    exclude: str,
) -> tuple[Room, ...]:
    """:func:`room_on` of every node but ``exclude`` that takes pods, the roomiest
    first (by free CPU, then memory, then name): :func:`judge` takes the first that fits."""
    rooms = [room_on(n, pods_on.get(n.name, ()), reservations, now) for n in nodes]
    found = [r for r in rooms if r is not None and r.node != exclude]
    return tuple(sorted(found, key=lambda r: (-r.free.cpu, -r.free.memory, r.node)))


def _tolerated(placement: Placement, taint: Taint) -> bool:
    return taint.effect not in _BLOCKING_EFFECTS or any(
        t.tolerates(taint) for t in placement.tolerations
    )


def allows(placement: Placement, room: Room) -> bool:
    """Whether a pod placed as ``placement`` says may be scheduled on ``room``'s node:
    ``nodeSelector``, required node affinity (any term; an empty term matches nothing,
    as upstream), and every NoSchedule/NoExecute taint tolerated."""
    labels = room.labels
    if any(labels.get(k) != v for k, v in placement.node_selector):
        return False
    if placement.terms and not any(
        term and all(r.matches(room.node, labels) for r in term) for term in placement.terms
    ):
        return False
    return all(_tolerated(placement, t) for t in room.taints)


def _fits(needs: Resources, free: Resources) -> bool:
    return (not needs.cpu or needs.cpu <= free.cpu) and (
        not needs.memory or needs.memory <= free.memory
    )


def _refused(pod: Pod) -> str:
    """Why ``pod`` cannot move whatever the rooms; empty when the rooms decide."""
    kind = pod.controller
    if not kind:
        return "no controller recreates it"
    if kind == "DaemonSet":
        return "its DaemonSet recreates it on this node only"
    if kind not in RECREATED_BY:
        return f"a {kind} is not known to recreate it"
    if pod.placement.unknown:
        return f"its {pod.placement.unknown} cannot be judged"
    return ""


def _room_for(
    needs: Resources, placement: Placement, rooms: Sequence[Room], taken: Mapping[str, Resources]
) -> Room | None:
    """The first of ``rooms`` with ``needs`` free beside ``taken`` that ``placement``
    allows."""
    for room in rooms:
        if needs.cpu and room.free.cpu < needs.cpu:
            break  # the roomiest first: no room further on has the CPU
        free = room.free
        if room.node in taken:
            free = (free - taken[room.node]).clamp()
        if _fits(needs, free) and allows(placement, room):
            return room
    return None


def _place(
    pod: Pod, needs: Resources, rooms: Sequence[Room], taken: Mapping[str, Resources]
) -> Move:
    room = _room_for(needs, pod.placement, rooms, taken)
    if room is None:
        return Move(False, "no other node that takes pods has room for it", needs=needs)
    return Move(True, f"its {pod.controller} can recreate it on {room.node}", room.node, needs)


def judge(pod: Pod, rooms: Sequence[Room], taken: Mapping[str, Resources] | None = None) -> Move:
    """Whether ``pod``'s replacement has a place in ``rooms``, with ``taken`` (by node)
    already promised to others: the first room that fits. ``rooms`` come the roomiest
    CPU first, as :func:`rooms_elsewhere` and the service give them; the search stops at
    the first with less free CPU than needed (in another order it may miss a room: a
    pod then counts as lost, never wrongly as movable). The replacement asks for what
    the pod's spec asks for now."""
    refused = _refused(pod)
    if refused:
        return Move(False, refused)
    return _place(pod, pod_requests(pod, "resizing"), rooms, taken or {})


def _asks(pod: Pod) -> Resources:
    return pod_requests(pod, "resizing")


def movable_among(
    pods: Sequence[Pod], rooms: Sequence[Room], asks: Callable[[Pod], Resources] = _asks
) -> frozenset[str]:
    """The uids of ``pods`` that :func:`judge` finds movable, each on its own: pods alike
    (one controller's, as most are) are judged once. ``asks(pod)`` must be
    ``pod_requests(pod, "resizing")`` (a caller that keeps it between decisions passes
    its own)."""
    seen: dict[tuple[Resources, Placement], bool] = {}
    movable = set()
    for pod in pods:
        if _refused(pod):
            continue
        key = (asks(pod), pod.placement)
        found = seen.get(key)
        if found is None:
            found = seen[key] = _room_for(*key, rooms, {}) is not None
        if found:
            movable.add(pod.uid)
    return frozenset(movable)


def claim(
    pods: Sequence[Pod], rooms: Sequence[Room], asks: Callable[[Pod], Resources] = _asks
) -> tuple[Move, ...]:
    """:func:`judge` of each of ``pods`` in the order given, each on what the ones
    before it left: two victims never count on the same room. ``asks`` as for
    :func:`movable_among`."""
    taken: dict[str, Resources] = {}
    moves = []
    for pod in pods:
        refused = _refused(pod)
        move = Move(False, refused) if refused else _place(pod, asks(pod), rooms, taken)
        if move.movable:
            taken[move.node] = taken.get(move.node, ZERO) + move.needs
        moves.append(move)
    return tuple(moves)
