"""PodDisruptionBudget accounting for victim selection (``filterPodsWithPDBViolation``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def split_by_violation(
    candidates: Sequence[Pod],
    budgets: Sequence[DisruptionBudget],
    mode: PdbMode,
    *,
    coverage: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[list[Pod], list[Pod]]:
    """Split ``candidates`` (most important first) into (violating, non-violating).

    Walking in order, each pod spends one disruption from every budget that covers it,
    unless the API server already counted it (``status.disruptedPods``). A pod that
    drives any budget below zero would violate it. Both lists keep the input order.

    ``coverage`` (from :meth:`~webhook.core.nodepods.NodePods.coverage` for the same
    budgets and mode) saves matching selectors: pod uid -> indexes of the budgets that
    cover the pod and have not counted it yet.
    """
    if coverage is not None:
        return _split_covered(candidates, coverage, budgets)
    allowed = [b.disruptions_allowed for b in budgets]
    # Only budgets of a pod's own namespace can cover it: index them once, so the walk
    # costs pods x (budgets in their namespace), not pods x all budgets. The entries
    # hold what :func:`budget_matches` reads.
    by_namespace: dict[str, list[tuple[int, LabelSelector | None, frozenset[str]]]] = {}
    for i, budget in enumerate(budgets):
        selector = budget.selector
        if selector is None or (selector.empty and mode != "respect"):
            continue  # matches no pod
        entry = (i, None if selector.empty else selector, budget.disrupted_pods)
        by_namespace.setdefault(budget.namespace, []).append(entry)
    violating: list[Pod] = []
    other: list[Pod] = []
    for pod in candidates:
        covering = by_namespace.get(pod.namespace)
        if covering is None or (mode != "respect" and not pod.labels):
            other.append(pod)
            continue
        violated = False
        for i, selector, disrupted in covering:
            # ``None``: an empty selector, which covers the whole namespace here.
            if selector is not None and not selector.matches(pod.labels):
                continue
            if pod.name in disrupted:
                continue
            allowed[i] -= 1
            if allowed[i] < 0:
                violated = True
        (violating if violated else other).append(pod)
    return violating, other


def _split_covered(
    candidates: Sequence[Pod],
    coverage: Mapping[str, tuple[int, ...]],
    budgets: Sequence[DisruptionBudget],
) -> tuple[list[Pod], list[Pod]]:
    """:func:`split_by_violation`'s walk, with the covering budgets already known (what
    is left of each is read only for the budgets the walk meets: a plan's few victims)."""
    allowed: dict[int, int] = {}
    violating: list[Pod] = []
    other: list[Pod] = []
    for pod in candidates:
        violated = False
        for i in coverage.get(pod.uid, ()):
            left = allowed.get(i)
            left = allowed[i] = (budgets[i].disruptions_allowed if left is None else left) - 1
            if left < 0:
                violated = True
        (violating if violated else other).append(pod)
    return violating, other
