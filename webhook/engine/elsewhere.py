"""Room elsewhere for victim order ``movable-first``, from the cluster view and the ledger.

The core judges movability on plain :class:`~webhook.core.movable.Room` values, the
roomiest first, and stops at the first room that fits. This hands them over in that
order as they are asked for, from two sources:

* :class:`~webhook.engine.rooms.NodeRooms`, each node's room before reservations,
  roomiest first. The cluster view owns one and tells it which nodes changed (a node, or
  a pod bound to it, added, modified or deleted); a node's room is added up again only
  when it is next read, so a review on a large cluster pays for the nodes that changed
  since the last, not for all.
* the ledger's active entries of other pods: the few nodes they touch get their room
  with those entries counted (:func:`~webhook.core.movable.room_on`) and take their
  place in the order among the rest.

Reservations of other nodes count while they are active (not expired): the check that an
entry still holds room needs that node's pods and is left out, which counts less room,
never more.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from webhook.core.accounting import Reservation
from webhook.core.movable import Room
from webhook.engine.ledger import ClusterView, Ledger
from webhook.engine.rooms import place


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
