"""Room elsewhere for victim order ``movable-first``, from the cluster view and the ledger.

The core judges movability on plain :class:`~webhook.core.movable.Room` values, the
roomiest first, and stops at the first room that fits. This hands them over in that
order as they are asked for, from two sources:

* :class:`NodeRooms`, each node's room before reservations, roomiest first. The cluster
  view owns one and tells it which nodes changed (a node, or a pod bound to it, added,
  modified or deleted); a node's room is added up again only when it is next read, so a
  review on a large cluster pays for the nodes that changed since the last, not for all.
* the ledger's active entries of other pods: the few nodes they touch get their room
  with those entries counted (:func:`~webhook.core.movable.room_on`) and take their
  place in the order among the rest.

Reservations of other nodes count while they are active (not expired): the check that an
entry still holds room needs that node's pods and is left out, which counts less room,
never more.
"""

from __future__ import annotations

import bisect
import heapq
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, overload

from webhook.core.accounting import Holdings, Reservation, holdings
from webhook.core.model import Node, Pod
from webhook.core.movable import Room, room_on
from webhook.engine.ledger import Ledger

if TYPE_CHECKING:
    from webhook.engine.ledger import ClusterView

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

    def refresh(self, view: ClusterView) -> None:
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

    def _update(self, view: ClusterView, names: set[str]) -> None:
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


class Rooms(Sequence[Room]):
    """Rooms the roomiest first, taken from ``source`` only as far as they are read: a
    search that stops at the first room that fits reads one or a few."""

    def __init__(self, source: Callable[[], Iterator[Room]]) -> None:
        self._source: Callable[[], Iterator[Room]] | None = source
        self._more: Iterator[Room] | None = None
        self._seen: list[Room] = []

    def _next(self) -> Room | None:
        if self._more is None:
            if self._source is None:
                return None
            self._more, self._source = self._source(), None
        room = next(self._more, None)
        if room is None:
            self._more = iter(())
        else:
            self._seen.append(room)
        return room

    def __iter__(self) -> Iterator[Room]:
        i = 0
        while i < len(self._seen) or self._next() is not None:
            yield self._seen[i]
            i += 1

    def __len__(self) -> int:
        while self._next() is not None:
            pass
        return len(self._seen)

    @overload
    def __getitem__(self, index: int) -> Room: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Room]: ...

    def __getitem__(self, index: int | slice) -> Room | Sequence[Room]:
        len(self)
        return self._seen[index]


class Elsewhere:
    """The rooms of every node but the resizing one, from the view's
    :class:`NodeRooms` and the ledger; thread-safe."""

    def __init__(self, cluster: ClusterView, ledger: Ledger) -> None:
        self.cluster = cluster
        self.ledger = ledger

    def rooms(self, exclude: str, now: float, pod_uid: str = "") -> Sequence[Room]:
        """The room every node but ``exclude`` that takes pods has now, with what the
        entries of pods other than ``pod_uid`` (the resizing one) hold and promised;
        the roomiest first (by free CPU, then memory, then name). Read lazily: nothing
        is looked at until the first room is asked for."""
        return Rooms(lambda: self._walk(exclude, now, pod_uid))

    def _walk(self, exclude: str, now: float, pod_uid: str) -> Iterator[Room]:
        index = self.cluster.node_rooms()
        index.refresh(self.cluster)
        touched = self._touched(now, pod_uid)
        rooms = index.roomiest()
        if touched:
            exact = [index.room_with(name, rs, now) for name, rs in touched.items()]
            found = sorted((r for r in exact if r is not None), key=place)
            rest = (r for r in rooms if r.node not in touched)
            rooms = heapq.merge(rest, found, key=place)
        for room in rooms:
            if room.node != exclude:
                yield room

    def _touched(self, now: float, pod_uid: str) -> dict[str, list[Reservation]]:
        """The active reservations of pods other than ``pod_uid``, by each node they
        hold or promised room on."""
        by_node: dict[str, list[Reservation]] = {}
        for entry in self.ledger.all_entries():
            r = entry.reservation()
            if not r.active(now) or r.pod_uid == pod_uid:
                continue
            by_node.setdefault(r.node, []).append(r)
            for name in {name for name, _ in r.moves} - {r.node}:
                by_node.setdefault(name, []).append(r)
        return by_node
