"""Properties every plan has, on random nodes: mixed priorities and start times, PDBs,
reservations, terminating, mirror and terminal pods, pods on another node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.builders import (
    HIGH,
    LOW,
    MID,
    NODE,
    NOW,
    OTHER_NODE,
    ZERO_PRIORITY,
    make_node,
    make_pdb,
    make_pod,
)
from webhook.core.accounting import NodeUsage, Reservation, active_on, node_usage, pod_requests
from webhook.core.model import DisruptionBudget, Node, Pod
from webhook.core.plan import NodePods, Plan, plan_resize, shortfall
from webhook.core.policy import DefaultPolicy, importance_key, rank
from webhook.core.resources import Resources, total
from webhook.engine.planner import NodeMemo

# Priority tiers, weighted; HIGH + 1 is above most resizing pods.
POD_PRIORITIES = (ZERO_PRIORITY, LOW, LOW, MID, MID, HIGH, HIGH + 1)
RESIZING_PRIORITIES = (ZERO_PRIORITY, LOW, MID, MID, HIGH, HIGH, HIGH, HIGH + 1)
NAMESPACES = ("default", "default", "batch", "kube-system")
APPS = ("a", "b", "c")
Mi = 2**20
Gi = 2**30

FAST = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class World:
    old: Pod
    new: Pod
    node: Node
    pods: list[Pod]
    budgets: list[DisruptionBudget]
    reservations: list[Reservation]
    policy: DefaultPolicy

    def plan(
        self,
        pods: list[Pod] | None = None,
        budgets: list[DisruptionBudget] | None = None,
        reservations: list[Reservation] | None = None,
    ) -> Plan:
        return plan_resize(
            self.old,
            self.new,
            NodePods(self.node, self.pods if pods is None else pods),
            now=NOW,
            budgets=self.budgets if budgets is None else budgets,
            reservations=self.reservations if reservations is None else reservations,
            policy=self.policy,
        )

    def usage(self) -> NodeUsage:
        active = active_on(self.reservations, NODE, NOW, exclude_pod=self.new.uid)
        return node_usage(self.node, self.pods, active, exclude_uid=self.new.uid)

    def claimed(self) -> set[str]:
        active = active_on(self.reservations, NODE, NOW, exclude_pod=self.new.uid)
        return {uid for r in active.values() for uid in r.victims}


# Strategies built once: building them per draw costs more than drawing from them.
STATES = st.sampled_from(["running"] * 12 + ["terminating", "mirror", "succeeded", "away"])
STATUS = st.sampled_from(["none", "admitted", "admitted", "pending-growth"])
POD = st.tuples(
    st.sampled_from(NAMESPACES),
    st.sampled_from(POD_PRIORITIES),
    st.integers(0, 2000),  # cpu, millicores
    st.integers(0, 2048),  # memory, Mi
    st.sampled_from((None, *APPS, *APPS)),  # label app
    st.one_of(st.none(), st.integers(0, 20_000)),  # start, seconds after T0
    STATUS,
    st.sampled_from([0] * 6 + [200]),  # sidecar cpu
    STATES,
)
BUDGET = st.tuples(
    st.sampled_from(NAMESPACES),
    st.sampled_from(("a", "b", "c", "a", "empty", "null")),
    st.sampled_from([0, 0, 1, 2, -1]),
    st.lists(st.integers(0, 13), max_size=2),  # disrupted pods, by index
)
RESERVATION = st.tuples(
    st.integers(0, 15),  # holder index; past the pods: a pod not seen yet
    st.lists(st.integers(0, 13), max_size=2),  # claimed victims, by index
    st.sampled_from([NODE, NODE, NODE, OTHER_NODE]),
    st.integers(0, 1500),
    st.integers(0, 1024),
    st.sampled_from([-10.0, 30.0, 60.0]),
)
SLACK = st.tuples(st.integers(-200, 1000), st.integers(0, 2048))  # cpu m, memory Mi
RESIZING = st.tuples(
    st.sampled_from(RESIZING_PRIORITIES),
    st.integers(100, 4000),  # cpu now
    st.integers(64, 4096),  # memory now, Mi
    st.integers(0, 20_000),  # start
    st.sampled_from([False] * 9 + [True]),  # preemptionPolicy Never
)
POLICY = st.builds(
    DefaultPolicy,
    pdb_mode=st.sampled_from(["respect", "best-effort"]),
    max_victims=st.sampled_from([None, None, None, 0, 1, 3]),
    protected_namespaces=st.sampled_from([frozenset(), frozenset(), frozenset({"kube-system"})]),
)


def _pod(i: int, spec: tuple[Any, ...]) -> Pod:
    namespace, priority, cpu, memory, app, start, status, sidecar, state = spec
    b = make_pod(f"p{i}", namespace).priority(priority).requests(f"{cpu}m", f"{memory}Mi")
    if app is not None:
        b.labels(app=app)
    if start is None:
        b.not_started()
    else:
        b.started(start)
    if status == "admitted":
        b.admitted()
    elif status == "pending-growth":
        b.status("app", allocated={"cpu": f"{cpu // 2}m", "memory": f"{memory}Mi"})
    if sidecar:
        b.sidecar("proxy", cpu=f"{sidecar}m")
    if state == "terminating":
        b.terminating()
    elif state == "mirror":
        b.mirror()
    elif state == "succeeded":
        b.phase("Succeeded")
    elif state == "away":
        b.on(OTHER_NODE)
    return b.build()


def _budget(i: int, spec: tuple[Any, ...], pods: list[Pod]) -> DisruptionBudget:
    namespace, selector, allowed, disrupted = spec
    b = make_pdb(f"pdb{i}", namespace).allowing(allowed).selector_spec(selector)
    b.disrupted(*sorted({pods[k].name for k in disrupted if k < len(pods)}))
    return b.build()


def _reservation(i: int, spec: tuple[Any, ...], pods: list[Pod]) -> Reservation:
    holder, victims, node, cpu, memory, expires_in = spec
    uid = pods[holder].uid if holder < len(pods) else f"unseen-{i}"
    return Reservation(
        pod_uid=uid,
        pod=f"default/{uid}",
        node=node,
        resources=Resources(cpu, memory * Mi),
        victims=frozenset(pods[k].uid for k in victims if k < len(pods)),
        expires_at=NOW + expires_in,
    )


@st.composite
def worlds(draw: Any) -> World:
    pods = [_pod(i, spec) for i, spec in enumerate(draw(st.lists(POD, min_size=1, max_size=14)))]
    budgets = [
        _budget(i, b, pods) for i, b in enumerate(draw(st.lists(BUDGET, min_size=1, max_size=3)))
    ]
    reservations = [
        _reservation(i, r, pods) for i, r in enumerate(draw(st.lists(RESERVATION, max_size=2)))
    ]
    # A node about as full as its pods make it, and growth of up to what they hold, so
    # that most resizes need preemption.
    held = total(pod_requests(p) for p in pods if p.node == NODE and not p.terminal)
    priority, cpu, memory, start, never = draw(RESIZING)
    slack_cpu, slack_memory = draw(SLACK)
    lower = total(
        pod_requests(p)
        for p in pods
        if p.node == NODE and p.priority < priority and not (p.terminal or p.mirror)
    )
    grow_cpu = draw(st.integers(1, max(lower.cpu + slack_cpu, 0) + 300))
    grow_memory = draw(st.sampled_from([0, 0, 0, lower.memory // Mi // 2, 64 * 1024]))
    builder = (
        make_pod("resizing")
        .priority(priority)
        .requests(f"{cpu}m", f"{memory}Mi")
        .started(start)
        .admitted()
    )
    if never:
        builder.never_preempts()
    old, new = builder.resize(f"{cpu + grow_cpu}m", f"{memory + grow_memory}Mi")
    allocatable = (
        max(held.cpu + cpu + slack_cpu, 1000),
        max(held.memory + memory * Mi + slack_memory * Mi, Gi),
    )
    node = make_node(NODE).allocatable(f"{allocatable[0]}m", str(allocatable[1])).build()
    return World(old, new, node, [*pods, old], budgets, reservations, draw(POLICY))


def _fits(demand: Resources, used: Resources, allocatable: Resources) -> bool:
    return shortfall(demand, used, allocatable).is_zero()


# Generating a world costs far more than planning it, so each test checks several
# properties of the same worlds.


@FAST
@given(worlds())
def test_victims_are_strictly_lower_priority_pods_on_the_node(world: World) -> None:
    plan = world.plan()
    by_uid = {p.uid: p for p in world.pods}
    claimed = world.claimed()

    # Only a preempt plan names victims; infeasible and not-eligible ones never do.
    if plan.verdict != "preempt":
        assert plan.victims == ()
    else:
        assert plan.victims
        assert not plan.shortfall.is_zero()
    for v in plan.victims:
        victim = by_uid[v.pod.uid]
        assert victim.priority < world.new.priority
        assert victim.priority == v.priority
        assert victim.node == NODE
        assert victim.uid != world.new.uid
        assert not (victim.mirror or victim.terminating or victim.terminal)
        assert victim.uid not in claimed
        assert world.policy.may_preempt(victim, world.new)
    # The policy's limits and the pod's own preemptionPolicy hold.
    if world.policy.max_victims is not None:
        assert len(plan.victims) <= world.policy.max_victims
    if world.policy.pdb_mode == "respect":
        assert not any(v.violates_pdb for v in plan.victims)
    if world.new.preemption_policy == "Never":
        assert plan.victims == ()
    # Every victim frees some of what the resize is short of; a pod without labels never
    # counts against a budget in best-effort mode (upstream).
    for v in plan.victims:
        assert (v.frees.cpu and plan.shortfall.cpu) or (v.frees.memory and plan.shortfall.memory)
        if world.policy.pdb_mode == "best-effort" and not by_uid[v.pod.uid].labels:
            assert not v.violates_pdb
    # Evicted least important first.
    keys = [importance_key(by_uid[v.pod.uid], NOW) for v in plan.victims]
    assert sorted(keys, reverse=True) == keys


@FAST
@given(worlds())
def test_victims_are_enough_and_each_one_is_needed(world: World) -> None:
    plan = world.plan()
    usage = world.usage()
    allocatable = world.node.allocatable

    assert (plan.verdict == "preempt") == bool(plan.victims)
    remaining = usage.in_use - usage.freeing
    for v in plan.victims:
        assert usage.held[v.pod.uid] == v.frees
        remaining = remaining - v.frees
    # Without its victims (and the pods already leaving) the resize fits ...
    if plan.verdict in ("fits", "preempt"):
        assert _fits(plan.requested, remaining, allocatable)
    # ... and keeping any single victim makes it not fit.
    for v in plan.victims:
        assert not _fits(plan.requested, remaining + v.frees, allocatable)
    # "Not enough even after preempting every eligible pod" is true.
    if plan.code == "insufficient-after-preemption":
        claimed = world.claimed()
        removable = Resources()
        for p in world.pods:
            if (
                p.node == NODE
                and p.uid != world.new.uid
                and p.priority < world.new.priority
                and not (p.mirror or p.terminating or p.terminal)
                and p.uid not in claimed
                and world.policy.may_preempt(p, world.new)
            ):
                removable = removable + usage.held[p.uid]
        stays = usage.in_use - usage.freeing - removable
        assert not _fits(plan.requested, stays, allocatable)


@FAST
@given(worlds(), st.randoms(use_true_random=False))
def test_plan_is_deterministic_and_independent_of_input_order(world: World, rnd: Any) -> None:
    plan = world.plan()
    pods, budgets, reservations = list(world.pods), list(world.budgets), list(world.reservations)
    rnd.shuffle(pods)
    rnd.shuffle(budgets)
    rnd.shuffle(reservations)

    assert plan == world.plan()
    assert plan == world.plan(pods, budgets, reservations)
    # The engine's memo of what pods hold and how they rank never changes a decision.
    listed = tuple(pods)
    view = NodeMemo(world.policy).of(world.node, listed, tuple(budgets), NOW)
    assert plan == plan_resize(
        world.old,
        world.new,
        view,
        now=NOW,
        budgets=budgets,
        reservations=reservations,
        policy=world.policy,
    )


@FAST
@given(worlds(), st.floats(min_value=0, max_value=2 * 86_400))
def test_the_memo_filled_earlier_gives_the_plan_of_now(world: World, earlier: float) -> None:
    # Kept from a decision ``earlier`` seconds ago, when pods not started yet (which
    # rank as starting now) stood elsewhere among the started ones.
    memo = NodeMemo(world.policy)
    pods, budgets = tuple(world.pods), tuple(world.budgets)
    memo.of(world.node, pods, budgets, NOW - earlier)
    view = memo.of(world.node, pods, budgets, NOW)

    assert rank(NODE, pods, budgets, world.policy, NOW) == view.ranked
    assert world.plan() == plan_resize(
        world.old,
        world.new,
        view,
        now=NOW,
        budgets=budgets,
        reservations=world.reservations,
        policy=world.policy,
    )
