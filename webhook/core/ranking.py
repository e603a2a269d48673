"""The node's pods in importance order, and the budgets each one's eviction spends from.

Victim selection reads both of every candidate, and neither depends on the resize: only
on the node's pods, its namespaces' PodDisruptionBudgets, the policy and (for pods not
started yet) the time. :func:`rank` computes them; a caller deciding many resizes on
the same pods may keep its :class:`Ranking` between decisions
(:class:`~webhook.engine.node_memo.NodeMemo` does, within the bounds of :attr:`Ranking.settled`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from webhook.core.disruption import spending
from webhook.core.model import DisruptionBudget, Pod
from webhook.core.policy import PreemptionPolicy, importance_key


@dataclass(frozen=True, slots=True)
class Ranking:
    """What :func:`rank` says of one set of pods and budgets."""

    #: The pods bound to the node and not terminal, most important first.
    pods: tuple[Pod, ...]
    #: Each pod's place in :attr:`pods`, by uid (0: the most important).
    place: Mapping[str, int]
    budgets: tuple[DisruptionBudget, ...]
    #: The indexes in :attr:`budgets` an eviction of each pod spends from, by uid.
    spends: Mapping[str, tuple[int, ...]]
    #: The latest start time among the pods (``-inf`` when none started): the default
    #: importance order reads the time only for pods without one (as starting then), so
    #: it is the same at every time after this one.
    settled: float


def rank(
    node: str,
    pods: Iterable[Pod],
    budgets: Sequence[DisruptionBudget],
    policy: PreemptionPolicy,
    now: float,
    spends: Mapping[str, tuple[int, ...]] | None = None,
) -> Ranking:
    """``pods`` bound to ``node`` and not terminal, in ``policy``'s importance order at
    ``now`` (a total order: the same whatever order they come in), and the budgets of
    ``budgets`` each would spend from in the policy's PDB mode.

    ``spends``, when given, must be ``spending(pods, budgets, policy.pdb_mode)`` (of at
    least the pods on the node): a caller that knows it for most of the pods already
    computes only the rest."""
    on_node = [p for p in pods if p.node == node and not p.terminal]
    on_node.sort(key=lambda p: policy.importance(p, now))
    kept = tuple(budgets)
    started = [p.start_time for p in on_node if p.start_time is not None]
    return Ranking(
        pods=tuple(on_node),
        place={p.uid: i for i, p in enumerate(on_node)},
        budgets=kept,
        spends=spending(on_node, kept, policy.pdb_mode) if spends is None else spends,
        settled=max(started, default=float("-inf")),
    )


def movable_first(ranking: Ranking, movable: frozenset[str], now: float) -> Ranking:
    """``ranking`` in victim order ``movable-first``: :func:`importance_key` with the
    pods of ``movable`` (uids) less important than the others of their priority."""
    if not movable:
        return ranking
    pods = sorted(ranking.pods, key=lambda p: importance_key(p, now, p.uid in movable))
    return replace(ranking, pods=tuple(pods), place={p.uid: i for i, p in enumerate(pods)})
