"""Room elsewhere for victim order ``movable-first``, from the cluster view and the ledger.

The core judges movability on plain :class:`~webhook.core.movable.Room` values; this
builds them for every node but the resizing one, with the resizing node's accounting.
What each node's pods hold is remembered while the node and its pods stay the same
objects (the cache replaces, never mutates, them), so a review on a large cluster only
adds up the nodes that changed.

Reservations of other nodes count while they are active (not expired): the check that an
entry still holds room needs that node's pods and is left out, which counts less room,
never more.
"""

from __future__ import annotations

from collections.abc import Sequence

from webhook.core.headroom import Holdings, holdings
from webhook.core.model import Node, Pod
from webhook.core.movable import Room, room_on, takes_pods
from webhook.core.reservation import Reservation
from webhook.engine.ledger import Ledger
from webhook.engine.ports import ClusterView


class Elsewhere:
    """The rooms of every node but the resizing one; thread-safe (a memo entry is
    replaced whole)."""

    def __init__(self, cluster: ClusterView, ledger: Ledger) -> None:
        self.cluster = cluster
        self.ledger = ledger
        #: By node name: the node and its pods as last read, what they hold, and the
        #: node's room when no reservation touches it.
        self._kept: dict[str, tuple[Node, Sequence[Pod], Holdings, Room | None]] = {}

    def _room(self, node: Node, reservations: Sequence[Reservation], now: float) -> Room | None:
        pods = self.cluster.pods_on(node.name)
        seen = self._kept.get(node.name)
        if seen is not None and seen[0] is node and seen[1] is pods:
            kept, room = seen[2], seen[3]
        else:
            kept = holdings(node, pods)
            room = room_on(node, pods, (), now, kept)
            self._kept[node.name] = (node, pods, kept, room)
        if reservations:
            return room_on(node, pods, reservations, now, kept)
        return room

    def rooms(self, exclude: str, now: float, pod_uid: str = "") -> tuple[Room, ...]:
        """The room every node but ``exclude`` that takes pods has now, with what the
        entries of pods other than ``pod_uid`` (the resizing one) hold and promised;
        the roomiest first (by free CPU, then memory, then name)."""
        by_node: dict[str, list[Reservation]] = {}
        for entry in self.ledger.all_entries():
            r = entry.reservation()
            if not r.active(now) or r.pod_uid == pod_uid:
                continue
            by_node.setdefault(r.node, []).append(r)
            for name in {name for name, _ in r.moves} - {r.node}:
                by_node.setdefault(name, []).append(r)
        rooms = []
        for node in self.cluster.all_nodes():
            if node.name == exclude or not takes_pods(node):
                continue
            room = self._room(node, by_node.get(node.name, ()), now)
            if room is not None:
                rooms.append(room)
        rooms.sort(key=lambda r: (-r.free.cpu, -r.free.memory, r.node))
        return tuple(rooms)
