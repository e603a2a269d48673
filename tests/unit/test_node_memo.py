"""The engine's one memo of the decision path: what each pod of a node holds and how the
pods rank, kept while the cluster view hands out the same pods and budgets."""

from __future__ import annotations

from unittest import mock

import pytest

from tests.unit.builders import NODE, NOW, T0, make_node, make_pdb, make_pod, plan, walkthrough
from webhook.core.accounting import holdings, pod_requests
from webhook.core.model import DisruptionBudget, Pod
from webhook.core.plan import plan_resize
from webhook.core.policy import DefaultPolicy, rank
from webhook.core.resources import Resources
from webhook.engine import admission
from webhook.engine.admission import NodeMemo

POLICY = DefaultPolicy()
SIZED = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
NO_BUDGETS: tuple[DisruptionBudget, ...] = ()


def _pods() -> tuple[Pod, ...]:
    return tuple(
        make_pod(f"p{i}").requests(cpu=f"{i + 1}").admitted().on(NODE).build() for i in range(3)
    )


def test_amounts_are_what_pod_requests_says() -> None:
    pods = _pods()
    facts = NodeMemo(POLICY).of(SIZED, pods, NO_BUDGETS, NOW)

    assert holdings(SIZED, pods) == facts.holdings
    assert [pod_requests(p) for p in pods] == [facts.holdings.held[p.uid] for p in pods]


def test_the_ranking_is_what_rank_says() -> None:
    pods = _pods()
    budgets = (make_pdb("p").selecting(app="web").build(),)

    assert (
        rank(NODE, pods, budgets, POLICY, NOW)
        == NodeMemo(POLICY).of(SIZED, pods, budgets, NOW).ranking
    )


def test_same_tuples_compute_nothing_again() -> None:
    pods, memo = _pods(), NodeMemo(POLICY)
    first = memo.of(SIZED, pods, NO_BUDGETS, NOW)

    with (
        mock.patch.object(admission, "pod_requests", side_effect=AssertionError),
        mock.patch.object(admission, "rank", side_effect=AssertionError),
        mock.patch.object(admission, "holdings", side_effect=AssertionError),
    ):
        facts = memo.of(SIZED, pods, NO_BUDGETS, NOW + 60)
        assert Resources(1000, 0) == facts.holdings.held[pods[0].uid]
    assert first is facts


def test_a_changed_pod_is_computed_again_the_others_kept() -> None:
    pods, memo = _pods(), NodeMemo(POLICY)
    memo.of(SIZED, pods, NO_BUDGETS, NOW)
    grown = make_pod("p1").requests(cpu="5").admitted().on(NODE).build()
    changed = (pods[0], grown, pods[2])

    with mock.patch.object(admission, "pod_requests", wraps=pod_requests) as computed:
        facts = memo.of(SIZED, changed, NO_BUDGETS, NOW)

    assert [mock.call(grown)] == computed.call_args_list
    assert [Resources(1000, 0), Resources(5000, 0), Resources(3000, 0)] == [
        facts.holdings.held[p.uid] for p in changed
    ]


def test_changed_budgets_rank_again() -> None:
    pods, memo = _pods(), NodeMemo(POLICY)
    before = memo.of(SIZED, pods, NO_BUDGETS, NOW)
    budgets = (make_pdb("p").selecting(app="web").build(),)

    after = memo.of(SIZED, pods, budgets, NOW)

    assert (budgets, False) == (after.ranking.budgets, before is after)


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

    facts = memo.of(SIZED, pods, NO_BUDGETS, NOW)

    assert expected == (first is facts)
    assert rank(NODE, pods, NO_BUDGETS, POLICY, NOW) == facts.ranking


def test_a_resized_node_holds_again() -> None:
    # A pod not admitted yet holds nothing on a node too small for it, its spec on one
    # large enough.
    waiting = make_pod("waiting").requests(cpu="10").on(NODE).build()
    memo = NodeMemo(POLICY)
    small = memo.of(SIZED, (waiting,), NO_BUDGETS, NOW)
    large = make_node(NODE).allocatable(cpu="16", memory="16Gi").build()

    grown = memo.of(large, (waiting,), NO_BUDGETS, NOW)

    assert [Resources(), Resources(10_000, 0)] == [
        small.holdings.held[waiting.uid],
        grown.holdings.held[waiting.uid],
    ]


def test_oldest_node_goes_past_the_bound() -> None:
    memo = NodeMemo(POLICY, size=2)
    for node in ("a", "b", "c"):
        memo.of(make_node(node).build(), _pods(), NO_BUDGETS, NOW)

    assert 2 == len(memo)


def test_plan_with_the_memo_is_the_plan_without() -> None:
    old, new, node, pods = walkthrough()
    listed = (*pods, old)
    facts = NodeMemo(POLICY).of(node, listed, NO_BUDGETS, NOW)

    assert plan(old, new, node, pods) == plan_resize(
        old, new, node, listed, now=NOW, holdings=facts.holdings, ranking=facts.ranking
    )
