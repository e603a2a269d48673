"""The engine's one memo of the decision path: what each pod of a node holds and how the
pods rank, kept while the cluster view hands out equal pods and budgets, and handed to
the core as the node's view."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from unittest import mock

import pytest

from tests.unit.builders import NODE, NOW, T0, make_node, make_pdb, make_pod, plan, walkthrough
from webhook.core.accounting import pod_requests
from webhook.core.model import DisruptionBudget, Pod
from webhook.core.plan import NodePods, plan_resize
from webhook.core.policy import DefaultPolicy, PreemptionPolicy, rank
from webhook.core.resources import Resources
from webhook.engine import planner
from webhook.engine.planner import NodeMemo

POLICY = DefaultPolicy()
SIZED = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
NO_BUDGETS: tuple[DisruptionBudget, ...] = ()
WEB_BUDGETS = (make_pdb("p").selecting(app="web").build(),)


def _pod(i: int, cpu: str | None = None, version: str | None = "1") -> Pod:
    built = make_pod(f"p{i}").labels(app="web").requests(cpu=cpu or f"{i + 1}").admitted()
    return (built.version(version) if version else built).on(NODE).build()


def _pods(version: str | None = "1") -> tuple[Pod, ...]:
    return tuple(_pod(i, version=version) for i in range(3))


def _nothing_computed() -> AbstractContextManager[object]:
    """Fails whatever computes an amount, a ranking or the budgets spent from."""
    refused = dict.fromkeys(("pod_requests", "rank", "holdings", "spending"), mock.DEFAULT)
    return mock.patch.multiple(
        planner, new_callable=lambda: mock.Mock(side_effect=AssertionError), **refused
    )


@pytest.mark.parametrize("budgets", [NO_BUDGETS, WEB_BUDGETS], ids=["no-budgets", "budgets"])
def test_the_view_answers_as_the_plain_view(budgets: tuple[DisruptionBudget, ...]) -> None:
    pods = _pods()
    plain = NodePods(SIZED, pods)

    view = NodeMemo(POLICY).of(SIZED, pods, budgets, NOW)

    assert (plain.holdings(), plain.ranking(budgets, POLICY, NOW)) == (
        view.holdings(),
        view.ranking(budgets, POLICY, NOW),
    )
    assert [pod_requests(p) for p in pods] == [view.holdings().held[p.uid] for p in pods]


@pytest.mark.parametrize(
    "again",
    [
        pytest.param(lambda pods: pods, id="the-same-tuple"),
        pytest.param(lambda pods: tuple(list(pods)), id="a-new-tuple"),
        pytest.param(lambda pods: tuple(replace(p) for p in pods), id="new-equal-pods"),
        pytest.param(
            lambda pods: (replace(pods[0], resource_version="2"), *pods[1:]),
            id="a-new-version-that-reads-the-same",
        ),
    ],
)
def test_equal_pods_and_budgets_compute_nothing_again(
    again: Callable[[tuple[Pod, ...]], tuple[Pod, ...]],
) -> None:
    pods, memo = _pods(), NodeMemo(POLICY)
    first = memo.of(SIZED, pods, WEB_BUDGETS, NOW)
    listed, budgets = again(pods), tuple(list(WEB_BUDGETS))

    with _nothing_computed():
        view = memo.of(SIZED, listed, budgets, NOW + 60)
        assert Resources(1000, 0) == view.holdings().held[pods[0].uid]
    assert first is view


@pytest.mark.parametrize(
    ("expected_computed", "version"),
    [
        pytest.param(["p1"], "1", id="versioned-pods-keep-their-amounts"),
        pytest.param(["p0", "p1", "p2"], None, id="pods-without-a-version-are-computed"),
    ],
)
def test_a_changed_pod_is_computed_again(expected_computed: list[str], version: str | None) -> None:
    pods, memo = _pods(version), NodeMemo(POLICY)
    memo.of(SIZED, pods, WEB_BUDGETS, NOW)
    grown = _pod(1, cpu="5", version="2" if version else None)
    changed = (pods[0], grown, pods[2])

    with mock.patch.object(planner, "pod_requests", wraps=pod_requests) as computed:
        view = memo.of(SIZED, changed, WEB_BUDGETS, NOW)

    assert expected_computed == [c.args[0].name for c in computed.call_args_list]
    assert [Resources(1000, 0), Resources(5000, 0), Resources(3000, 0)] == [
        view.holdings().held[p.uid] for p in changed
    ]
    assert NodePods(SIZED, changed).ranking(WEB_BUDGETS, POLICY, NOW) == view.ranked


def test_a_new_list_with_one_pod_in_a_new_version_gives_fresh_facts() -> None:
    # The cluster view builds a new tuple; the pod at p1's place is another version of it
    # (a new resourceVersion) that no longer matches the budget and holds more.
    pods, memo = _pods(), NodeMemo(POLICY)
    memo.of(SIZED, pods, WEB_BUDGETS, NOW)
    moved = make_pod("p1").labels(app="db").requests(cpu="4").admitted().version("2").build()
    listed = tuple(moved if p.name == "p1" else p for p in pods)

    view = memo.of(SIZED, listed, WEB_BUDGETS, NOW)

    plain = NodePods(SIZED, listed)
    assert (plain.holdings(), plain.ranking(WEB_BUDGETS, POLICY, NOW)) == (
        view.holdings(),
        view.ranked,
    )
    assert () == view.ranked.spends[moved.uid]


@pytest.mark.parametrize(
    ("expected_kept", "budgets"),
    [
        pytest.param(True, tuple(list(WEB_BUDGETS)), id="equal-budgets-kept"),
        pytest.param(False, NO_BUDGETS, id="other-budgets-ranked-again"),
    ],
)
def test_budgets_are_compared_by_value(
    expected_kept: bool, budgets: tuple[DisruptionBudget, ...]
) -> None:
    pods, memo = _pods(), NodeMemo(POLICY)
    before = memo.of(SIZED, pods, WEB_BUDGETS, NOW)

    after = memo.of(SIZED, pods, budgets, NOW)

    assert (expected_kept, budgets) == (before is after, after.ranked.budgets)


@pytest.mark.parametrize(
    ("budgets", "policy", "now"),
    [
        pytest.param(NO_BUDGETS, POLICY, NOW, id="other-budgets"),
        pytest.param(WEB_BUDGETS, DefaultPolicy(pdb_mode="best-effort"), NOW, id="other-policy"),
        pytest.param(WEB_BUDGETS, POLICY, T0 - 10, id="a-time-the-ranking-does-not-hold"),
    ],
)
def test_the_view_ranks_afresh_for_what_it_did_not_keep(
    budgets: tuple[DisruptionBudget, ...], policy: PreemptionPolicy, now: float
) -> None:
    pods = (
        *_pods(),
        make_pod("waiting").not_started().on(NODE).build(),
        make_pod("started").started(100).on(NODE).build(),
    )
    view = NodeMemo(POLICY).of(SIZED, pods, WEB_BUDGETS, NOW)

    assert rank(NODE, pods, budgets, policy, now) == view.ranking(budgets, policy, now)


@pytest.mark.parametrize(
    ("expected", "start", "earlier"),
    [
        pytest.param(True, 100.0, 60.0, id="every-pod-started-before-both-kept"),
        pytest.param(False, NOW - T0 - 30, 60.0, id="a-pod-started-in-between-ranked-again"),
        pytest.param(True, NOW - T0 - 30, 0.0, id="same-time-kept"),
    ],
)
def test_the_ranking_is_kept_while_the_order_cannot_have_changed(
    expected: bool, start: float, earlier: float
) -> None:
    # A pod not started counts as starting now: it ranks after "started" only once the
    # time is past that pod's start.
    pods = (
        make_pod("waiting").not_started().on(NODE).build(),
        make_pod("started").started(start).on(NODE).build(),
    )
    memo = NodeMemo(POLICY)
    first = memo.of(SIZED, pods, NO_BUDGETS, NOW - earlier)

    view = memo.of(SIZED, pods, NO_BUDGETS, NOW)

    assert expected == (first is view)
    assert rank(NODE, pods, NO_BUDGETS, POLICY, NOW) == view.ranking(NO_BUDGETS, POLICY, NOW)


def test_a_resized_node_holds_again() -> None:
    # A pod not admitted yet holds nothing on a node too small for it, its spec on one
    # large enough.
    waiting = make_pod("waiting").requests(cpu="10").version("1").on(NODE).build()
    memo = NodeMemo(POLICY)
    small = memo.of(SIZED, (waiting,), NO_BUDGETS, NOW)
    large = make_node(NODE).allocatable(cpu="16", memory="16Gi").build()

    grown = memo.of(large, (waiting,), NO_BUDGETS, NOW)

    assert [Resources(), Resources(10_000, 0)] == [
        small.holdings().held[waiting.uid],
        grown.holdings().held[waiting.uid],
    ]


def test_a_node_changed_but_not_resized_is_the_view_s_node() -> None:
    pods, memo = _pods(), NodeMemo(POLICY)
    memo.of(SIZED, pods, NO_BUDGETS, NOW)
    cordoned = replace(SIZED, unschedulable=True)

    with _nothing_computed():
        view = memo.of(cordoned, pods, NO_BUDGETS, NOW)

    assert cordoned == view.node


def test_oldest_node_goes_past_the_bound() -> None:
    memo = NodeMemo(POLICY, size=2)
    for node in ("a", "b", "c"):
        memo.of(make_node(node).build(), _pods(), NO_BUDGETS, NOW)

    assert 2 == len(memo)


def test_plan_with_the_memo_is_the_plan_without() -> None:
    old, new, node, pods = walkthrough()
    listed = (*pods, old)
    view = NodeMemo(POLICY).of(node, listed, NO_BUDGETS, NOW)

    assert plan(old, new, node, pods) == plan_resize(old, new, view, now=NOW)
