"""NodePods: a node's pods indexed once. Plans and usage with the index must equal those
without it, and the engine must build a new index whenever the view's pods change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.builders import HIGH, LOW, MID, NODE, NOW, make_node, make_pdb, make_pod
from tests.unit.test_plan_properties import FAST, World, worlds
from webhook.core.headroom import node_usage
from webhook.core.model import Pod
from webhook.core.nodepods import Candidates, NodePods
from webhook.core.plan import Plan, plan_resize
from webhook.core.policy import DefaultPolicy, ImportanceKey
from webhook.core.reservation import active_on
from webhook.core.resources import Resources
from webhook.engine.admission import AdmissionEngine
from webhook.engine.config import Config
from webhook.engine.node_indexes import NodeIndexes
from webhook.engine.reconciler import Reconciler
from webhook.testing import InMemoryLedger, StaticClusterView


def _plan(world: World, pods: tuple[Pod, ...], index: NodePods | None = None) -> Plan:
    return plan_resize(
        world.old,
        world.new,
        world.node,
        pods,
        now=NOW,
        budgets=world.budgets,
        reservations=world.reservations,
        policy=world.policy,
        index=index,
    )


@FAST
@given(worlds())
def test_an_index_changes_no_plan(world: World) -> None:
    pods = tuple(world.pods)
    index = NodePods(NODE, pods)
    expected = _plan(world, pods)
    for _ in range(2):  # the second time from the remembered budget coverage
        assert expected == _plan(world, pods, index)


@FAST
@given(worlds())
def test_an_index_changes_no_usage(world: World) -> None:
    pods = tuple(world.pods)
    active = active_on(world.reservations, NODE, NOW, exclude_pod=world.new.uid)
    expected = node_usage(world.node, pods, active, exclude_uid=world.new.uid)
    index = NodePods(NODE, pods)
    assert expected == node_usage(world.node, pods, active, exclude_uid=world.new.uid, index=index)


class _Ranked(DefaultPolicy):
    """Another ranking (least priority first): the index's order must not be used."""

    def importance(self, pod: Pod, now: float) -> ImportanceKey:
        return (pod.priority, -(pod.start_time or now), pod.namespace, pod.name)


@FAST
@given(worlds())
def test_an_index_leaves_another_ranking_alone(world: World) -> None:
    pods = tuple(world.pods)
    policy = _Ranked(world.policy.pdb_mode, world.policy.max_victims)
    args = (world.old, world.new, world.node, pods)
    kwargs = {"now": NOW, "budgets": world.budgets, "reservations": world.reservations}
    assert plan_resize(*args, **kwargs, policy=policy) == plan_resize(  # type: ignore[arg-type]
        *args,
        **kwargs,
        policy=policy,
        index=NodePods(NODE, pods),  # type: ignore[arg-type]
    )


def test_an_index_of_other_pods_is_not_used() -> None:
    low = make_pod("low").priority(LOW).requests(cpu="3").started(100).build()
    old, new = make_pod("high").priority(HIGH).requests(cpu="4").started(50).resize(cpu="6")
    node = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
    stale = NodePods(NODE, (old,))  # built before "low" was bound
    plan = plan_resize(old, new, node, (low, old), now=NOW, index=stale)
    assert ("default/low",) == plan.victim_keys


@pytest.mark.parametrize(
    ("budgets", "mode", "expected"),
    [
        # (selector, disruptions allowed, disrupted pod names) per budget
        ([("a", 1, ())], "respect", {"p-a": (0,)}),
        ([("a", 1, ("p-a",))], "respect", {}),  # already counted by the API server
        ([("empty", 0, ())], "respect", {"p-a": (0,), "p-b": (0,)}),
        ([("empty", 0, ())], "best-effort", {}),  # as kube-scheduler: matches nothing
        ([("null", 0, ())], "respect", {}),
        ([("b", 0, ()), ("a", 0, ())], "respect", {"p-a": (1,), "p-b": (0,)}),
    ],
)
def test_budget_coverage(
    budgets: Sequence[tuple[str, int, tuple[str, ...]]],
    mode: str,
    expected: dict[str, tuple[int, ...]],
) -> None:
    pods = tuple(
        make_pod(f"p-{app}").labels(app=app).priority(LOW).started(1).build() for app in "ab"
    )
    built = []
    for i, (selector, allowed, disrupted) in enumerate(budgets):
        b = make_pdb(f"pdb{i}").allowing(allowed).disrupted(*disrupted)
        built.append(b.selector_spec(selector).build())
    index = NodePods(NODE, pods)
    by_name = {p.uid: p.name for p in pods}
    coverage = index.coverage(built, mode)  # type: ignore[arg-type]
    assert expected == {by_name[uid]: found for uid, found in coverage.items()}
    # Other budgets (a changed status, say) are matched again, not taken from the memo.
    changed = [replace(b, disrupted_pods=frozenset({"p-a", "p-b"})) for b in built]
    assert {} == index.coverage(changed, mode)  # type: ignore[arg-type]


def test_ranked_below_is_strictly_lower_priority_most_important_first() -> None:
    pods = (
        make_pod("mid-late").priority(MID).started(300).build(),
        make_pod("low").priority(LOW).started(100).build(),
        make_pod("mid-early").priority(MID).started(200).build(),
        make_pod("high").priority(HIGH).started(100).build(),
        make_pod("waiting").priority(LOW).not_started().build(),
        make_pod("leaving").priority(LOW).started(100).terminating().build(),
    )
    index = NodePods(NODE, pods)
    assert ["mid-early", "mid-late", "low"] == [p.name for p in index.ranked_below(HIGH)]
    assert ["low"] == [p.name for p in index.ranked_below(MID)]
    assert [] == [p.name for p in index.ranked_below(LOW)]
    assert ["waiting"] == [p.name for p in index.unstarted]
    assert ["leaving"] == [p.name for p in index.leaving]


class _ChangingView(StaticClusterView):
    """A view whose pods can be replaced, handing out a new tuple as the cache does."""

    def set_pods(self, pods: Sequence[Pod]) -> None:
        self._by_node = {NODE: tuple(pods)}


def _engine_verdict(engine: AdmissionEngine, old: Pod, new: Pod) -> tuple[str, tuple[str, ...]]:
    index = engine._node_pods(NODE, tuple(engine.cluster.pods_on(NODE)))
    plan = plan_resize(
        old,
        new,
        engine.cluster.node(NODE),  # type: ignore[arg-type]
        index.pods,
        now=NOW,
        policy=engine.policy,
        index=index,
    )
    return plan.verdict, plan.victim_keys


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("nothing", ("preempt", ("default/low",))),
        ("victim gone", ("fits", ())),
        ("victim now important", ("infeasible", ())),
        ("another victim", ("preempt", ("default/lower",))),
    ],
)
def test_the_engine_indexes_the_pods_the_view_has_now(
    change: str, expected: tuple[str, tuple[str, ...]]
) -> None:
    old, new = make_pod("high").priority(HIGH).requests(cpu="4").started(50).resize(cpu="6")
    low = make_pod("low").priority(LOW).requests(cpu="3").started(100).build()
    node = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
    view = _ChangingView([node], [old, low])
    engine = AdmissionEngine(Config(), view, InMemoryLedger())
    assert ("preempt", ("default/low",)) == _engine_verdict(engine, old, new)
    if change == "victim gone":
        view.set_pods([old])
    elif change == "victim now important":
        view.set_pods([old, replace(low, priority=HIGH + 1)])
    elif change == "another victim":
        lower = make_pod("lower").priority(LOW - 1).requests(cpu="3").started(100).build()
        kept = make_pod("low").priority(HIGH + 1).requests(cpu="1").started(100).build()
        view.set_pods([old, kept, lower])
    assert expected == _engine_verdict(engine, old, new)


def test_the_engine_keeps_an_index_while_the_pods_stay() -> None:
    old = make_pod("high").priority(HIGH).requests(cpu="4").started(50).build()
    view = StaticClusterView([make_node(NODE).build()], [old])
    engine = AdmissionEngine(Config(), view, InMemoryLedger())
    first = engine._node_pods(NODE, tuple(view.pods_on(NODE)))
    assert first is engine._node_pods(NODE, tuple(view.pods_on(NODE)))
    assert first is not engine._node_pods(NODE, (old,))  # an equal but other tuple


def test_node_indexes_keep_the_most_recent_nodes_up_to_their_bound() -> None:
    pods = (make_pod("a").on("node-a").build(),)
    indexes = NodeIndexes(size=2)
    first = indexes.get("node-a", pods)
    indexes.get("node-b", ())
    assert first is indexes.get("node-a", pods)
    indexes.get("node-c", ())  # a third node: the oldest kept one goes

    assert 2 == len(indexes)
    assert first is not indexes.get("node-a", pods)


def test_the_reconciler_plans_from_an_index_of_the_pods_the_view_has_now() -> None:
    deferred = (
        make_pod("high")
        .priority(HIGH)
        .requests(cpu="6", memory="1Gi")
        .holding(cpu="4", memory="1Gi")
        .started(50)
        .deferred()
        .build()
    )
    low = make_pod("low").priority(LOW).requests(cpu="3").started(100).admitted().build()
    node = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
    view = StaticClusterView([node], [deferred, low])
    reconciler = Reconciler(Config(), view, InMemoryLedger(), clock=lambda: NOW)

    [outcome] = reconciler.reconcile()

    assert outcome.plan is not None
    assert ("preempt", ("default/low",)) == (
        outcome.plan.verdict,
        tuple(v.pod.key for v in outcome.plan.victims),
    )
    kept = reconciler._indexes.kept(NODE)
    assert kept is not None
    assert tuple(view.pods_on(NODE)) is kept.pods


def _walk(
    amounts: Sequence[tuple[int, int]],
    order: Sequence[int],
    used: tuple[int, int],
    room: tuple[int | None, int | None],
) -> list[int]:
    """Step 7 as the scheduler writes it: one pod at a time, in order."""
    cpu, memory = used
    chosen = []
    for i in order:
        with_cpu, with_memory = cpu + amounts[i][0], memory + amounts[i][1]
        if (room[0] is None or with_cpu <= room[0]) and (room[1] is None or with_memory <= room[1]):
            cpu, memory = with_cpu, with_memory
        else:
            chosen.append(i)
    return chosen


@FAST
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=12),
    st.integers(0, 2**12),
    st.tuples(st.integers(-10, 10), st.integers(-10, 10)),
    st.tuples(st.none() | st.integers(-10, 40), st.none() | st.integers(-10, 40)),
)
def test_the_reprieve_takes_back_the_pods_the_walk_takes_back(
    amounts: list[tuple[int, int]],
    budget_mask: int,
    used: tuple[int, int],
    room: tuple[int | None, int | None],
) -> None:
    # Pods of budgets that allow nothing are reprieved first: a mask of them shuffles the
    # walk's order away from the importance order.
    pods = [
        make_pod(f"p{i}").labels(guarded="yes" if budget_mask >> i & 1 else "no").build()
        for i in range(len(amounts))
    ]
    budgets = [make_pdb("guard").selecting(guarded="yes").allowing(0).build()]
    chain = Candidates.build(pods, [Resources(c, m) for c, m in amounts], budgets, "respect")

    assert _walk(amounts, chain.order, used, room) == chain.reprieve(*used, *room)
    assert sorted(chain.order) == list(range(len(pods)))
