"""What a decision reads of a recently planned node's pods alone, kept between decisions.

A decision reads what every pod on the node holds (``pod_requests``, the kubelet's
model), the pods' importance order and the PodDisruptionBudgets each one's eviction
spends from (:func:`~webhook.core.policy.rank`). None of it depends on the resize, only
on the node's pods and its namespaces' budgets, so the engine keeps it for the last
tuple of pods and of budgets it planned each node with, and the core computes the same
when nothing is kept (``python -m bench plan``: docs/decision-core.md has the figures).
It is the one memo of the decision path.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace

from webhook.core.accounting import Holdings, holdings, pod_requests
from webhook.core.disruption import spending
from webhook.core.model import DisruptionBudget, Node, Pod
from webhook.core.policy import PreemptionPolicy, Ranking, rank
from webhook.core.resources import Resources

#: Nodes kept. Decisions come in bursts on the nodes being resized; the bound keeps a
#: large cluster's worth of them out of memory.
NODES_KEPT = 256


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the memo keeps of one node for one tuple of its pods and of its budgets.

    ``holdings``: :func:`~webhook.core.accounting.holdings` of the pods on a node of
    ``allocatable``; ``by_id``: ``pod_requests`` of each pod, by pod identity, for the
    next tuple to reuse (holding ``pods`` keeps their ids, the keys, from being reused by
    other objects while this lives). ``ranking``: :func:`~webhook.core.policy.rank` of
    them at ``ranked_at``.
    """

    pods: tuple[Pod, ...]
    budgets: tuple[DisruptionBudget, ...]
    allocatable: Resources
    by_id: Mapping[int, Resources]
    holdings: Holdings
    ranking: Ranking
    ranked_at: float

    def ranked_for(self, now: float) -> bool:
        """Whether :attr:`ranking` is the ranking at ``now`` too: the importance order
        reads the time only for pods not started yet, as starting then, so it is the same
        at any two times after the latest start time (:attr:`Ranking.settled`; at it, a
        pod not started ties with the last one started)."""
        return now == self.ranked_at or min(now, self.ranked_at) > self.ranking.settled


class NodeMemo:
    """A bounded, thread-safe memo of :class:`NodeFacts`, one per node, under one policy.

    The policy's importance order must read the time as
    :func:`~webhook.core.policy.importance_key` does (every policy of the service
    does). Both cluster views replace a node's tuple of pods when any of its pods changes,
    and the tuple of a set of namespaces' budgets when any budget changes (and never
    change a tuple), so the tuples' identities are the versions of what is kept.
    """

    def __init__(self, policy: PreemptionPolicy, size: int = NODES_KEPT) -> None:
        self.policy = policy
        self.size = size
        self._kept: dict[str, NodeFacts] = {}
        self._lock = threading.Lock()

    def of(
        self,
        node: Node,
        pods: tuple[Pod, ...],
        budgets: tuple[DisruptionBudget, ...],
        now: float,
    ) -> NodeFacts:
        """What ``pods`` on ``node`` hold and their ranking with ``budgets`` at ``now``:
        the kept facts while both tuples and the node's allocatable are the same (and the
        ranking holds at ``now``). A new tuple of pods reuses the amounts of the pods it
        shares with the kept one (the views replace only the pods that changed; a shared
        id is the very same immutable pod, as the kept facts hold their pods)."""
        kept = self._kept.get(node.name)
        if (
            kept is not None
            and kept.pods is pods
            and kept.budgets is budgets
            and kept.allocatable == node.allocatable
        ):
            if kept.ranked_for(now):
                return kept
            facts = replace(
                kept, ranking=rank(node.name, pods, budgets, self.policy, now), ranked_at=now
            )
        else:
            before = kept.by_id if kept is not None else {}
            by_id: dict[int, Resources] = {}
            for p in pods:
                amount = before.get(id(p))
                by_id[id(p)] = pod_requests(p) if amount is None else amount
            facts = NodeFacts(
                pods,
                budgets,
                node.allocatable,
                by_id,
                holdings(node, pods, lambda p: by_id[id(p)]),
                rank(node.name, pods, budgets, self.policy, now, self._spends(kept, pods, budgets)),
                now,
            )
        with self._lock:
            if len(self._kept) >= self.size and node.name not in self._kept:
                # The oldest insertion goes: a dict keeps insertion order.
                del self._kept[next(iter(self._kept))]
            self._kept[node.name] = facts
        return facts

    def _spends(
        self, kept: NodeFacts | None, pods: tuple[Pod, ...], budgets: tuple[DisruptionBudget, ...]
    ) -> dict[str, tuple[int, ...]] | None:
        """``spending`` of ``pods``: what the kept facts say of the very pods they share,
        under the same budgets, and computed for the others (None: nothing to share)."""
        if kept is None or kept.budgets is not budgets:
            return None
        known = {id(p): kept.ranking.spends[p.uid] for p in kept.ranking.pods}
        spends = {p.uid: known[id(p)] for p in pods if id(p) in known}
        fresh = [p for p in pods if id(p) not in known]
        return spends | spending(fresh, budgets, self.policy.pdb_mode)

    def __len__(self) -> int:
        return len(self._kept)
