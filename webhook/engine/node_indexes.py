"""The :class:`~webhook.core.nodepods.NodePods` of recently planned nodes, kept between
decisions and built again as soon as a node's pods change."""

from __future__ import annotations

import threading

from webhook.core.model import Pod
from webhook.core.nodepods import NodePods

#: Nodes whose index is kept. Decisions come in bursts on the nodes being resized; an
#: index holds about as much as its node's pods, so a bound keeps a large cluster's
#: worth of them out of memory.
NODE_INDEXES = 256


class NodeIndexes:
    """A bounded memo of node indexes; thread-safe.

    Both cluster views replace a node's tuple of pods when any of its pods changes (and
    never change a tuple), so the tuple's identity is the version of the node's pods. An
    index holds its tuple, so that identity cannot be reused while the index is kept.
    """

    def __init__(self, size: int = NODE_INDEXES) -> None:
        self.size = size
        self._indexes: dict[str, NodePods] = {}
        self._lock = threading.Lock()

    def get(self, node: str, pods: tuple[Pod, ...]) -> NodePods:
        """The index of ``pods`` on ``node``: the kept one if built for this very tuple."""
        index = self._indexes.get(node)
        if index is not None and index.pods is pods:
            return index
        index = NodePods(node, pods)
        with self._lock:
            if len(self._indexes) >= self.size and node not in self._indexes:
                # The oldest insertion goes: a dict keeps insertion order.
                del self._indexes[next(iter(self._indexes))]
            self._indexes[node] = index
        return index

    def kept(self, node: str) -> NodePods | None:
        """The index kept for ``node``, whatever tuple it was built for."""
        return self._indexes.get(node)

    def __len__(self) -> int:
        return len(self._indexes)


__all__ = ["NODE_INDEXES", "NodeIndexes"]
