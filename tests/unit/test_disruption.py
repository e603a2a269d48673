"""PodDisruptionBudget accounting: which budgets cover a pod, and upstream's
``filterPodsWithPDBViolation`` split."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import pytest

from tests.unit.builders import LOW, PdbBuilder, make_pdb, make_pod
from webhook.core.model import PdbMode, Pod
from webhook.core.policy import budget_matches, spending, split_by_violation


def app_pod(name: str, app: str = "db", namespace: str = "default") -> Pod:
    return make_pod(name, namespace).priority(LOW).requests(cpu="1").labels(app=app).build()


def unlabelled_pod(name: str) -> Pod:
    return make_pod(name).priority(LOW).requests(cpu="1").build()


@pytest.mark.parametrize(
    ("budget", "pod", "mode", "expected"),
    [
        pytest.param(make_pdb("p").selecting(app="db"), app_pod("a"), "respect", True, id="labels"),
        pytest.param(
            make_pdb("p").selecting(app="web"), app_pod("a"), "respect", False, id="other-labels"
        ),
        pytest.param(
            make_pdb("p", "elsewhere").selecting(app="db"),
            app_pod("a"),
            "respect",
            False,
            id="other-namespace",
        ),
        pytest.param(
            make_pdb("p").empty_selector(),
            app_pod("a"),
            "respect",
            True,
            id="empty-selector-respect-covers-the-namespace",
        ),
        pytest.param(
            make_pdb("p").empty_selector(),
            app_pod("a"),
            "best-effort",
            False,
            id="empty-selector-best-effort-covers-nothing",
        ),
        pytest.param(
            make_pdb("p", "elsewhere").empty_selector(),
            app_pod("a"),
            "respect",
            False,
            id="empty-selector-stays-in-its-namespace",
        ),
        pytest.param(
            make_pdb("p").null_selector(),
            app_pod("a"),
            "respect",
            False,
            id="null-selector-respect-covers-nothing",
        ),
        pytest.param(
            make_pdb("p").null_selector(),
            app_pod("a"),
            "best-effort",
            False,
            id="null-selector-best-effort-covers-nothing",
        ),
        pytest.param(
            make_pdb("p").null_selector().expression("app", "NotIn", "web"),
            app_pod("a"),
            "best-effort",
            True,
            id="expression",
        ),
        # Upstream's FilterVictimsWithPDBViolation: a pod without labels never counts.
        pytest.param(
            make_pdb("p").null_selector().expression("app", "DoesNotExist"),
            unlabelled_pod("a"),
            "best-effort",
            False,
            id="unlabelled-pod-best-effort-never-covered",
        ),
        # The Eviction API (policy/v1) matches the selector against the pod's labels,
        # none included.
        pytest.param(
            make_pdb("p").null_selector().expression("app", "DoesNotExist"),
            unlabelled_pod("a"),
            "respect",
            True,
            id="unlabelled-pod-respect-matched-as-the-eviction-api-does",
        ),
        pytest.param(
            make_pdb("p").empty_selector(),
            unlabelled_pod("a"),
            "respect",
            True,
            id="unlabelled-pod-respect-empty-selector-covers-it",
        ),
    ],
)
def test_budget_matches(budget: PdbBuilder, pod: Pod, mode: PdbMode, expected: bool) -> None:
    assert expected == budget_matches(budget.build(), pod, mode)


def _split(
    pods: list[Pod], budgets: list[PdbBuilder], mode: PdbMode = "respect"
) -> tuple[list[str], list[str]]:
    built = [b.build() for b in budgets]
    violating, other = split_by_violation(pods, built, spending(pods, built, mode))
    return [p.name for p in violating], [p.name for p in other]


@pytest.mark.parametrize(
    ("pods", "budgets", "mode", "violating", "other"),
    [
        pytest.param(
            [app_pod("a"), app_pod("b")],
            [],
            "respect",
            [],
            ["a", "b"],
            id="no-budgets",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b")],
            [make_pdb("db").selecting(app="db").allowing(0)],
            "respect",
            ["a", "b"],
            [],
            id="none-allowed",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b"), app_pod("c")],
            [make_pdb("db").selecting(app="db").allowing(1)],
            "respect",
            ["b", "c"],
            ["a"],
            id="first-in-order-spends-the-disruption",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b")],
            [make_pdb("db").selecting(app="db").allowing(2)],
            "respect",
            [],
            ["a", "b"],
            id="enough-allowed",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b")],
            [make_pdb("db").selecting(app="db").allowing(0).disrupted("a")],
            "respect",
            ["b"],
            ["a"],
            id="disruptedPods-spend-nothing",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b")],
            [make_pdb("db").selecting(app="db").allowing(1).disrupted("a")],
            "respect",
            [],
            ["a", "b"],
            id="disruptedPods-leave-the-budget-to-others",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b", app="web")],
            [
                make_pdb("db").selecting(app="db").allowing(5),
                make_pdb("all").empty_selector().allowing(1),
            ],
            "respect",
            ["b"],
            ["a"],
            id="any-covering-budget-below-zero-violates",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b", app="web")],
            [
                make_pdb("db").selecting(app="db").allowing(5),
                make_pdb("all").empty_selector().allowing(1),
            ],
            "best-effort",
            [],
            ["a", "b"],
            id="best-effort-ignores-the-empty-selector",
        ),
        pytest.param(
            [app_pod("a", namespace="x"), app_pod("b", namespace="y")],
            [make_pdb("db", "x").selecting(app="db").allowing(0)],
            "respect",
            ["a"],
            ["b"],
            id="budgets-bind-in-their-namespace",
        ),
        pytest.param(
            [app_pod("a"), app_pod("b")],
            [make_pdb("db").null_selector().allowing(0)],
            "respect",
            [],
            ["a", "b"],
            id="null-selector",
        ),
        pytest.param(
            [app_pod("b"), app_pod("a")],
            [make_pdb("db").selecting(app="db").allowing(1)],
            "respect",
            ["a"],
            ["b"],
            id="order-given-is-the-order-walked",
        ),
        pytest.param(
            [unlabelled_pod("a"), app_pod("b")],
            [make_pdb("not-web").null_selector().expression("app", "NotIn", "web").allowing(0)],
            "best-effort",
            ["b"],
            ["a"],
            id="best-effort-unlabelled-pod-never-violates",
        ),
        pytest.param(
            [unlabelled_pod("a"), app_pod("b")],
            [make_pdb("not-web").null_selector().expression("app", "NotIn", "web").allowing(0)],
            "respect",
            ["a", "b"],
            [],
            id="respect-unlabelled-pod-matched-as-the-eviction-api-does",
        ),
    ],
)
def test_split_by_violation(
    pods: list[Pod],
    budgets: list[PdbBuilder],
    mode: PdbMode,
    violating: list[str],
    other: list[str],
) -> None:
    assert (violating, other) == _split(pods, budgets, mode)


def test_negative_disruptions_allowed_violates_at_once() -> None:
    assert (["a"], []) == _split([app_pod("a")], [make_pdb("db").selecting(app="db").allowing(-1)])
