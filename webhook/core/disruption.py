"""PodDisruptionBudget accounting for victim selection (upstream
``FilterVictimsWithPDBViolation``, ``pkg/scheduler/framework/preemption/util.go``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

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
