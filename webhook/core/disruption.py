"""PodDisruptionBudget accounting for victim selection (``filterPodsWithPDBViolation``)."""

from __future__ import annotations

from collections.abc import Sequence

from webhook.core.model import DisruptionBudget, PdbMode, Pod


def budget_matches(budget: DisruptionBudget, pod: Pod, mode: PdbMode) -> bool:
    """Whether ``budget`` covers ``pod``.

    kube-scheduler treats a null *or empty* selector as matching nothing. The Eviction API
    follows policy/v1, where an empty selector matches every pod in the namespace. In
    ``respect`` mode we predict what the Eviction API will do, so we use the latter.
    """
    if budget.namespace != pod.namespace or budget.selector is None:
        return False
    if budget.selector.empty:
        return mode == "respect"
    return budget.selector.matches(pod.labels)


def split_by_violation(
    candidates: Sequence[Pod], budgets: Sequence[DisruptionBudget], mode: PdbMode
) -> tuple[list[Pod], list[Pod]]:
    """Split ``candidates`` (most important first) into (violating, non-violating).

    Walking in order, each pod spends one disruption from every budget that covers it,
    unless the API server already counted it (``status.disruptedPods``). A pod that
    drives any budget below zero would violate it. Both lists keep the input order.
    """
    allowed = [b.disruptions_allowed for b in budgets]
    violating: list[Pod] = []
    other: list[Pod] = []
    for pod in candidates:
        violated = False
        for i, budget in enumerate(budgets):
            if not budget_matches(budget, pod, mode) or pod.name in budget.disrupted_pods:
                continue
            allowed[i] -= 1
            if allowed[i] < 0:
                violated = True
        (violating if violated else other).append(pod)
    return violating, other
