"""Policy hooks around the fixed victim-selection algorithm.

The algorithm in :mod:`webhook.core.plan` is fixed; what an operator may tune goes through
a :class:`PreemptionPolicy`: which pods may ever be victims, how importance is ranked,
how PodDisruptionBudgets bind, how many victims one resize may take, and whether pods
that opted in lend part of their resources before anyone is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from webhook.core.model import PdbMode, Pod

ImportanceKey = tuple[int, bool, float, str, str]
VictimOrder = Literal["upstream", "movable-first"]


def importance_key(pod: Pod, now: float, movable: bool = False) -> ImportanceKey:
    """Sort key, most important first: kube-scheduler's ``MoreImportantPod``.

    Higher priority first; on a tie the earlier ``status.startTime`` (a pod that has not
    started counts as starting ``now``). Upstream stops there; namespace and name make
    the order total, so plans do not depend on the order pods were listed in.

    ``movable`` (victim order ``movable-first``, :mod:`webhook.core.movable`): within one
    priority, a pod whose work would move elsewhere is less important than one whose
    work would be lost; a lower-priority pod still always goes before a higher one.
    Upstream's order is every pod at ``movable=False``.
    """
    start = pod.start_time if pod.start_time is not None else now
    return (-pod.priority, movable, start, pod.namespace, pod.name)


class PreemptionPolicy(Protocol):
    """What an operator can tune. Implementations must be pure and deterministic."""

    @property
    def pdb_mode(self) -> PdbMode:
        """``respect``: never plan a victim whose eviction a PDB forbids (the plan becomes
        infeasible instead). ``best-effort``: upstream's behaviour - prefer victims that
        violate no PDB, but take them if nothing else will do."""
        ...

    @property
    def max_victims(self) -> int | None:
        """Upper bound on victims for one resize; ``None`` for no bound."""
        ...

    @property
    def lending(self) -> bool:
        """Whether candidates with a floor annotation lend down to their floors before
        (and besides) victims are chosen (docs/lending.md). Only annotated pods lend."""
        ...

    def may_preempt(self, victim: Pod, preemptor: Pod) -> bool:
        """Extra eligibility on top of the fixed rules (lower priority, same node, not a
        mirror pod, not already terminating)."""
        ...

    def importance(self, pod: Pod, now: float) -> ImportanceKey:
        """Ranking key, most important first; must be a total order."""
        ...


@dataclass(frozen=True, slots=True)
class DefaultPolicy:
    """Upstream ranking; PDBs respected; victims from any namespace not protected;
    annotated pods lend."""

    pdb_mode: PdbMode = "respect"
    max_victims: int | None = None
    protected_namespaces: frozenset[str] = frozenset()
    lending: bool = True

    def may_preempt(self, victim: Pod, preemptor: Pod) -> bool:
        return victim.namespace not in self.protected_namespaces

    def importance(self, pod: Pod, now: float) -> ImportanceKey:
        return importance_key(pod, now)
