"""The engine's one memo of the decision path: what each pod of a node holds, kept
while the cluster view hands out the same pods."""

from __future__ import annotations

from unittest import mock

from tests.unit.builders import NODE, NOW, make_pod, plan, walkthrough
from webhook.core.accounting import pod_requests
from webhook.core.model import Pod
from webhook.core.plan import plan_resize
from webhook.core.resources import Resources
from webhook.engine import held_amounts
from webhook.engine.held_amounts import HeldAmounts


def _pods() -> tuple[Pod, ...]:
    return tuple(make_pod(f"p{i}").requests(cpu=f"{i + 1}").admitted().build() for i in range(3))


def test_amounts_are_what_pod_requests_says() -> None:
    pods = _pods()
    holds = HeldAmounts().of(NODE, pods)

    assert [pod_requests(p) for p in pods] == [holds(p) for p in pods]


def test_same_tuple_computes_nothing_again() -> None:
    pods, memo = _pods(), HeldAmounts()
    memo.of(NODE, pods)

    with mock.patch.object(held_amounts, "pod_requests", side_effect=AssertionError):
        holds = memo.of(NODE, pods)
        assert Resources(1000, 0) == holds(pods[0])


def test_a_changed_pod_is_computed_again_the_others_kept() -> None:
    pods, memo = _pods(), HeldAmounts()
    memo.of(NODE, pods)
    grown = make_pod("p1").requests(cpu="5").admitted().build()
    changed = (pods[0], grown, pods[2])

    with mock.patch.object(held_amounts, "pod_requests", wraps=pod_requests) as computed:
        holds = memo.of(NODE, changed)

    assert [mock.call(grown)] == computed.call_args_list
    assert [Resources(1000, 0), Resources(5000, 0), Resources(3000, 0)] == [
        holds(p) for p in changed
    ]


def test_a_pod_not_in_the_tuple_is_computed() -> None:
    holds = HeldAmounts().of(NODE, _pods())
    other = make_pod("elsewhere").requests(cpu="7").build()

    assert Resources(7000, 0) == holds(other)


def test_oldest_node_goes_past_the_bound() -> None:
    memo = HeldAmounts(size=2)
    for node in ("a", "b", "c"):
        memo.of(node, _pods())

    assert 2 == len(memo)


def test_plan_with_the_memo_is_the_plan_without() -> None:
    old, new, node, pods = walkthrough()
    listed = (*pods, old)
    holds = HeldAmounts().of(NODE, listed)

    assert plan(old, new, node, pods) == plan_resize(old, new, node, listed, now=NOW, holds=holds)
