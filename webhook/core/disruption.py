"""PodDisruptionBudget accounting for victim selection (upstream
``FilterVictimsWithPDBViolation``, ``pkg/scheduler/framework/preemption/util.go``)."""

from __future__ import annotations

from collections.abc import Sequence

from webhook.core.model import DisruptionBudget, PdbMode, Pod


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
    pods: Sequence[Pod], budgets: Sequence[DisruptionBudget], mode: PdbMode
) -> tuple[list[Pod], list[Pod]]:
    """Split ``pods`` (most important first) into (violating, non-violating).

    Walking in order, each pod spends one disruption from every budget that covers it,
    unless the API server already counted it (``status.disruptedPods``). A pod that
    drives any budget below zero would violate it. Both lists keep the input order.
    """
    left = [b.disruptions_allowed for b in budgets]
    # Only a budget of the pod's own namespace can cover it: the walk costs pods x
    # (budgets in their namespace), not pods x budgets of the whole cluster.
    in_namespace: dict[str, list[int]] = {}
    for i, budget in enumerate(budgets):
        in_namespace.setdefault(budget.namespace, []).append(i)
    violating: list[Pod] = []
    other: list[Pod] = []
    for pod in pods:
        violated = False
        for i in in_namespace.get(pod.namespace, ()):
            budget = budgets[i]
            if pod.name in budget.disrupted_pods or not budget_matches(budget, pod, mode):
                continue
            left[i] -= 1
            violated = violated or left[i] < 0
        (violating if violated else other).append(pod)
    return violating, other
