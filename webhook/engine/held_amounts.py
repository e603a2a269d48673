"""What each pod of a recently planned node holds, kept between decisions.

A decision reads what every pod on the node holds (``pod_requests``, the kubelet's
model); that depends on the pods alone, not on the resize. Computing it for a node's
110 pods is three quarters of a decision (``python -m bench plan``: 1.05 ms median
without the amounts kept, 0.27 ms with them; docs/decision-core.md), so the engine keeps
the amounts of the last tuple of pods it planned each node with. It is the one memo of
the decision path; the core computes the same amounts when none is given.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from webhook.core.accounting import pod_requests
from webhook.core.model import Pod
from webhook.core.resources import Resources

#: Nodes whose amounts are kept. Decisions come in bursts on the nodes being resized;
#: the bound keeps a large cluster's worth of them out of memory.
NODES_KEPT = 256


@dataclass(frozen=True, slots=True)
class Amounts:
    """``pod_requests`` of one tuple of a node's pods, by pod identity; a pod from
    elsewhere is computed. Holding ``pods`` keeps their ids, the keys, from being reused
    by other objects while this lives."""

    pods: tuple[Pod, ...]
    by_id: Mapping[int, Resources]

    def __call__(self, pod: Pod) -> Resources:
        amount = self.by_id.get(id(pod))
        return pod_requests(pod) if amount is None else amount


class HeldAmounts:
    """A bounded, thread-safe memo of :class:`Amounts`, one per node.

    Both cluster views replace a node's tuple of pods when any of its pods changes (and
    never change a tuple), so the tuple's identity is the version of the node's pods.
    """

    def __init__(self, size: int = NODES_KEPT) -> None:
        self.size = size
        self._kept: dict[str, Amounts] = {}
        self._lock = threading.Lock()

    def of(self, node: str, pods: tuple[Pod, ...]) -> Amounts:
        """What ``pods`` on ``node`` hold: the kept amounts while the tuple is the same.
        A new tuple reuses the amounts of the pods it shares with the kept one (the views
        replace only the pods that changed; a shared id is the very same immutable pod,
        as the kept amounts hold their pods)."""
        kept = self._kept.get(node)
        if kept is not None and kept.pods is pods:
            return kept
        before = kept.by_id if kept is not None else {}
        by_id: dict[int, Resources] = {}
        for p in pods:
            amount = before.get(id(p))
            by_id[id(p)] = pod_requests(p) if amount is None else amount
        amounts = Amounts(pods, by_id)
        with self._lock:
            if len(self._kept) >= self.size and node not in self._kept:
                # The oldest insertion goes: a dict keeps insertion order.
                del self._kept[next(iter(self._kept))]
            self._kept[node] = amounts
        return amounts

    def __len__(self) -> int:
        return len(self._kept)
