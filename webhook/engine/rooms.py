"""Every node's room before reservations, kept in order as nodes change: the one count
of free room on other nodes, an index the cluster view owns. Victim order
``movable-first`` reads it with the ledger's entries (:mod:`webhook.engine.elsewhere`),
and so does the restorer choosing where a checkpointed pod comes back
(:mod:`webhook.engine.pauses`). Apart from both, so that the view's port can name it
without importing what reads the ledger.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

from webhook.core.accounting import Holdings, Reservation, holdings
from webhook.core.model import Node, Pod
from webhook.core.movable import Room, room_on


class NodesView(Protocol):
    """What :meth:`NodeRooms.refresh` reads of the cluster view."""

    def node(self, name: str) -> Node | None: ...

    def all_nodes(self) -> Sequence[Node]: ...

    def pods_on(self, node: str) -> Sequence[Pod]: ...


#: A room's place in the order: the roomiest first (by free CPU, then memory, then name),
#: as :func:`~webhook.core.movable.rooms_elsewhere` sorts them.
Place = tuple[int, int, str]


def place(room: Room) -> Place:
    return (-room.free.cpu, -room.free.memory, room.node)


class NodeRooms:
    """Every node's room before reservations, kept in order as nodes change.

    The owner calls :meth:`changed` after a node or its pods changed (after the change is
    readable); readers call :meth:`refresh` with the current view, which adds up again
    only the nodes changed since. Readers may run in many threads at once: refreshes
    serialize, and each publishes a new order rather than changing the one a reader is
    walking.
    """

    def __init__(self) -> None:
        self._refreshing = threading.Lock()
        self._marking = threading.Lock()
        #: Nodes changed since the last refresh; ``None``: every node (nothing read yet).
        self._stale: set[str] | None = None
        #: By node name: what its pods hold, and its room (``None``: takes no pods).
        self._kept: dict[str, tuple[Node, Sequence[Pod], Holdings, Room | None]] = {}
        #: Every room after its :func:`place`, sorted; replaced whole, never changed in
        #: place, so a reader walks one consistent order.
        self._order: list[tuple[int, int, str, Room]] = []

    def changed(self, node: str) -> None:
        """``node``, or what is bound to it, changed."""
        with self._marking:
            if self._stale is not None:
                self._stale.add(node)

    def refresh(self, view: NodesView) -> None:
        """Adds up again the nodes changed since the last refresh, as ``view`` has them."""
        if self._stale is not None and not self._stale:
            return
        with self._refreshing:
            # Taken before the view is read: a change made while it is read marks again.
            with self._marking:
                stale, self._stale = self._stale, set()
            if stale is None:
                stale = {n.name for n in view.all_nodes()} | set(self._kept)
            self._update(view, stale)

    def _update(self, view: NodesView, names: set[str]) -> None:
        order = list(self._order)
        for name in names:
            old = self._kept.pop(name, None)
            if old is not None and old[3] is not None:
                del order[bisect.bisect_left(order, place(old[3]))]
            node = view.node(name)
            if node is None:
                continue
            pods = view.pods_on(name)
            kept = holdings(node, pods)
            room = room_on(node, pods, (), 0.0, kept)  # no reservations: no time read
            self._kept[name] = (node, pods, kept, room)
            if room is not None:
                bisect.insort(order, (*place(room), room))
        self._order = order

    def room(self, name: str) -> Room | None:
        """``name``'s room as of the last refresh (``None``: unknown or takes no pods)."""
        kept = self._kept.get(name)
        return kept[3] if kept is not None else None

    def room_with(self, name: str, reservations: Sequence[Reservation], now: float) -> Room | None:
        """``name``'s room with ``reservations`` (any node's) counted, as of the last
        refresh."""
        kept = self._kept.get(name)
        if kept is None or kept[3] is None:
            return None
        node, pods, held, _ = kept
        return room_on(node, pods, reservations, now, held)

    def roomiest(self) -> Iterator[Room]:
        """Every room as of the last refresh, the roomiest first."""
        for *_, room in self._order:
            yield room


__all__ = ["NodeRooms", "NodesView", "Place", "place"]
