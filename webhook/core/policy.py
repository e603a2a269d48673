"""The victim order: the policy hooks around the fixed victim-selection algorithm,
the node's pods ranked in that order with the budgets each one's eviction spends from,
and the PodDisruptionBudget accounting victim selection does with them (upstream
``FilterVictimsWithPDBViolation``, ``pkg/scheduler/framework/preemption/util.go``).

The algorithm in :mod:`webhook.core.plan` is fixed; what an operator may tune goes through
a :class:`PreemptionPolicy`: which pods may ever be victims, how importance is ranked,
how PodDisruptionBudgets bind, how many victims one resize may take, and whether pods
that opted in lend part of their resources before anyone is evicted.

Victim selection reads the importance order and the budgets of every candidate, and
neither depends on the resize: only on the node's pods, its namespaces'
PodDisruptionBudgets, the policy and (for pods not started yet) the time. :func:`rank`
computes them; a caller deciding many resizes on the same pods may keep its
:class:`Ranking` between decisions, within the bounds of :attr:`Ranking.settled`, and
hand it to a plan through the node's view (:class:`~webhook.core.plan.NodeView`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from webhook.core.model import DisruptionBudget, LabelSelector, PdbMode, Pod


def budget_matches(budget: DisruptionBudget, pod: Pod, mode: PdbMode) -> bool:
    """Whether ``budget`` covers ``pod``.

    kube-scheduler (``FilterVictimsWithPDBViolation``) never counts a pod without labels
    and treats a null *or empty* selector as matching nothing: so ``best-effort``. The
    Eviction API follows policy/v1: an empty selector matches every pod in the
    namespace, and a selector is matched against the pod's labels, none included (a
    ``DoesNotExist`` expression matches a pod without labels). In ``respect`` mode we
    predict what the Eviction API will do, so we use the latter.
    """
    if budget.namespace != pod.namespace or budget.selector is None:
        return False
    if mode != "respect" and not pod.labels:
        return False
    if budget.selector.empty:
        return mode == "respect"
    return budget.selector.matches(pod.labels)


def spending(
    pods: Iterable[Pod], budgets: Sequence[DisruptionBudget], mode: PdbMode
) -> dict[str, tuple[int, ...]]:
    """Which budgets an eviction of each of ``pods`` spends from, by pod uid: the indexes
    in ``budgets`` of those covering it (:func:`budget_matches`), leaving out any that
    already counted the pod (``status.disruptedPods``)."""
    # Only a budget of the pod's own namespace can cover it: the walk costs pods x
    # (budgets in their namespace), not pods x budgets of the whole cluster.
    in_namespace: dict[str, list[int]] = {}
    for i, budget in enumerate(budgets):
        in_namespace.setdefault(budget.namespace, []).append(i)
    return {
        pod.uid: tuple(
            i
            for i in in_namespace.get(pod.namespace, ())
            if pod.name not in budgets[i].disrupted_pods and budget_matches(budgets[i], pod, mode)
        )
        for pod in pods
    }


def split_by_violation(
    pods: Sequence[Pod],
    budgets: Sequence[DisruptionBudget],
    spends: Mapping[str, Sequence[int]],
) -> tuple[list[Pod], list[Pod]]:
    """Split ``pods`` (most important first) into (violating, non-violating).

    Walking in order, each pod spends one disruption from every budget it spends from
    (``spends``, by uid, as :func:`spending` says). A pod that drives any budget below
    zero would violate it. Both lists keep the input order.
    """
    left = [b.disruptions_allowed for b in budgets]
    violating: list[Pod] = []
    other: list[Pod] = []
    for pod in pods:
        violated = False
        for i in spends[pod.uid]:
            left[i] -= 1
            violated = violated or left[i] < 0
        (violating if violated else other).append(pod)
    return violating, other


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

    @property
    def lend_memory_limits(self) -> bool:
        """Whether a Guaranteed pod's memory floor lends too, its limit going down with its
        request. Off by default: a process that grows past a lowered limit is OOM-killed
        (:func:`webhook.core.lending.lends`)."""
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
    lend_memory_limits: bool = False

    def may_preempt(self, victim: Pod, preemptor: Pod) -> bool:
        return victim.namespace not in self.protected_namespaces

    def importance(self, pod: Pod, now: float) -> ImportanceKey:
        return importance_key(pod, now)


#: Namespaces whose pods are never victims unless an operator opts them in: the cluster's
#: own components, and (added by the service's settings) the service's own namespace.
SYSTEM_NAMESPACES: frozenset[str] = frozenset({"kube-system"})


@dataclass(frozen=True, slots=True)
class Preemptors:
    """Who may preempt: pods of namespaces whose labels ``namespaces`` selects (``None``:
    every namespace), at priority ``min_priority`` or above (``None``: any priority).

    One judgement for the admission path and the reconciler, so a resize the webhook
    configuration never shows the service is held to the same rule when the kubelet
    defers it."""

    namespaces: LabelSelector | None = None
    min_priority: int | None = None

    def refusal(self, preemptor: Pod, namespace_labels: Mapping[str, str] | None) -> str:
        """Why ``preemptor`` may not take room from other pods, ``""`` when it may.
        ``namespace_labels``: the labels of its namespace, ``None`` when the namespace is
        not known (refused while a selector is set: its labels cannot be judged)."""
        # Short: the kubectl warning carrying it is cut at 120 characters, and the
        # person reading it knows the pod's namespace.
        if self.min_priority is not None and preemptor.priority < self.min_priority:
            return (
                f"priority {preemptor.priority} under the preemptor policy's minimum "
                f"{self.min_priority}; nobody preempted"
            )
        if self.namespaces is not None:
            if namespace_labels is None:
                return "namespace not known yet to the preemptor policy; nobody preempted"
            if not self.namespaces.matches(namespace_labels):
                return "namespace not selected by the preemptor policy; nobody preempted"
        return ""


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


def movable_first(ranking: Ranking, movable: frozenset[str]) -> Ranking:
    """``ranking`` in victim order ``movable-first``: within each priority, the pods of
    ``movable`` (uids) after the others, each kept in the ranking's order. For the
    default policy this is :func:`importance_key` with ``movable`` set for those pods."""
    if not movable:
        return ranking
    pods: list[Pod] = []
    deferred: list[Pod] = []  # the movable pods of the current priority
    priority = None
    for p in ranking.pods:
        if p.priority != priority:
            pods += deferred
            deferred, priority = [], p.priority
        (deferred if p.uid in movable else pods).append(p)
    pods += deferred
    return replace(ranking, pods=tuple(pods), place={p.uid: i for i, p in enumerate(pods)})
