"""Properties of plans with lenders, on random nodes: pods of mixed priorities, some with
floors (cpu, memory or both, some above the request, some malformed), Guaranteed and
Burstable, init containers and sidecars, RestartContainer policies, PDBs, a reservation."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.builders import (
    HIGH,
    LOW,
    MID,
    NODE,
    NOW,
    ZERO_PRIORITY,
    make_node,
    make_pdb,
    make_pod,
    make_reservation,
)
from webhook.core.accounting import NodeUsage, Reservation, active_on, node_usage, pod_requests
from webhook.core.lending import room
from webhook.core.model import DisruptionBudget, Node, Pod
from webhook.core.plan import NodePods, Plan, candidates_of, lent, plan_resize, shortfall
from webhook.core.policy import DefaultPolicy
from webhook.core.resources import Resources, total
from webhook.engine.planner import NodeMemo

Mi = 2**20
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

    def plan(self, pods: list[Pod] | None = None, policy: DefaultPolicy | None = None) -> Plan:
        return plan_resize(
            self.old,
            self.new,
            NodePods(self.node, self.pods if pods is None else pods),
            now=NOW,
            budgets=self.budgets,
            reservations=self.reservations,
            policy=policy or self.policy,
        )

    def usage(self) -> NodeUsage:
        return node_usage(self.node, self.pods, self.reserved(), exclude_uid=self.new.uid)

    def reserved(self) -> dict[str, Reservation]:
        return active_on(self.reservations, NODE, NOW, exclude_pod=self.new.uid)

    def lenders(self) -> dict[str, Resources]:
        """What each pod that may lend frees at its floors, found without the planner."""
        claimed = frozenset(uid for r in self.reserved().values() for uid in r.victims)
        held = self.usage().held
        return {
            p.uid: room(p)
            for p in candidates_of(self.new, NODE, self.pods, claimed, self.policy)
            if p.uid not in self.reserved() and not held[p.uid].is_zero() and not room(p).is_zero()
        }


FLOORS = st.sampled_from(["none", "none", "cpu", "cpu", "memory", "both", "malformed"])
POD = st.tuples(
    st.sampled_from((ZERO_PRIORITY, LOW, LOW, MID, HIGH)),
    st.integers(100, 3000),  # cpu, millicores
    st.integers(64, 4096),  # memory, Mi
    FLOORS,
    st.sampled_from((10, 30, 50, 80, 100, 120)),  # floor, percent of the request
    st.sampled_from(("Burstable", "Burstable", "Guaranteed")),
    st.sampled_from(("none", "none", "init", "sidecar")),
    st.sampled_from([False] * 5 + [True]),  # cpu resizePolicy RestartContainer
    st.sampled_from(("admitted", "admitted", "admitted", "spec-only", "terminating")),
    st.integers(0, 20_000),  # start
    st.sampled_from((None, "a", "b")),  # label app
)
RESIZING = st.tuples(
    st.sampled_from((LOW, MID, HIGH, HIGH, HIGH)),
    st.integers(100, 3000),
    st.integers(64, 4096),
)
POLICY = st.builds(
    DefaultPolicy,
    pdb_mode=st.sampled_from(["respect", "best-effort"]),
    max_victims=st.sampled_from([None, None, None, 1]),
)


def _pod(i: int, spec: tuple[Any, ...]) -> Pod:
    priority, cpu, memory, floors, percent, qos, extra, restarts, state, start, app = spec
    b = make_pod(f"p{i}").priority(priority).requests(f"{cpu}m", f"{memory}Mi").started(start)
    if extra == "init":
        b.init_container("setup", cpu=f"{cpu * 3 // 4}m")
    elif extra == "sidecar":
        b.sidecar("proxy", cpu="200m")
    if app is not None:
        b.labels(app=app)
    b.qos(qos)
    if floors in ("cpu", "both"):
        b.floor(cpu=f"{cpu * percent // 100}m")
    if floors in ("memory", "both"):
        b.floor(memory=f"{memory * percent // 100}Mi")
    if floors == "malformed":
        b.annotate("resize-preemption.io/floor", '{"app": {"cpu": "-1"}}')
    if restarts:
        b.resize_policy("cpu")
    if state != "spec-only":
        b.admitted()
    if state == "terminating":
        b.terminating()
    return b.build()


@st.composite
def worlds(draw: Any) -> World:
    pods = [_pod(i, s) for i, s in enumerate(draw(st.lists(POD, min_size=1, max_size=10)))]
    budgets = [
        make_pdb(f"pdb-{app}").selecting(app=app).allowing(draw(st.integers(0, 1))).build()
        for app in draw(st.sets(st.sampled_from(("a", "b"))))
    ]
    reservations = []
    if draw(st.booleans()):
        holder = draw(st.sampled_from(pods))
        reservations.append(make_reservation(holder.name, cpu="500m", memory="64Mi"))
    priority, cpu, memory = draw(RESIZING)
    held = total(pod_requests(p) for p in pods)
    grow_cpu = draw(st.integers(1, max(held.cpu, 1) + 500))
    grow_memory = draw(st.sampled_from([0, 0, 256, 2048]))
    old, new = (
        make_pod("resizing")
        .priority(priority)
        .requests(f"{cpu}m", f"{memory}Mi")
        .started(50)
        .admitted()
        .resize(f"{cpu + grow_cpu}m", f"{memory + grow_memory}Mi")
    )
    slack_cpu, slack_memory = draw(st.integers(-200, 1500)), draw(st.integers(0, 2048))
    node = (
        make_node(NODE)
        .allocatable(
            f"{max(held.cpu + cpu + slack_cpu, 1000)}m",
            str(held.memory + (memory + slack_memory) * Mi),
        )
        .build()
    )
    return World(old, new, node, [*pods, old], budgets, reservations, draw(POLICY))


def _fits(demand: Resources, used: Resources, allocatable: Resources) -> bool:
    return shortfall(demand, used, allocatable).is_zero()


@FAST
@given(worlds())
def test_lending_alone_evicts_nobody_and_loans_free_only_what_is_short(world: World) -> None:
    plan = world.plan()
    usage = world.usage()
    allocatable = world.node.allocatable
    projected = usage.in_use - usage.freeing
    lenders = world.lenders()

    # Loans only in preempt plans; lending alone enough means nobody is evicted.
    if plan.verdict != "preempt":
        assert () == plan.loans
    if plan.verdict == "preempt" and _fits(
        plan.requested, projected - total(lenders.values()), allocatable
    ):
        assert () == plan.victims
        assert "lend" == plan.code
    # Without the victims and with the loans the resize fits; the loans free no more
    # than is still short once the victims are gone.
    gone = projected - total(v.frees for v in plan.victims)
    if plan.verdict == "preempt":
        assert _fits(plan.requested, gone - lent(plan.loans), allocatable)
        short = shortfall(plan.requested, gone, allocatable)
        assert lent(plan.loans).fits_in(short)
        assert all(loan.frees > 0 for loan in plan.loans)


@FAST
@given(worlds())
def test_each_victim_is_needed_even_with_every_kept_lender_at_its_floors(world: World) -> None:
    plan = world.plan()
    usage = world.usage()
    lenders = world.lenders()
    victims = {v.pod.uid for v in plan.victims}
    kept_room = total(r for uid, r in lenders.items() if uid not in victims)
    floors = usage.in_use - usage.freeing - total(v.frees for v in plan.victims) - kept_room

    for v in plan.victims:
        # Kept, a victim that lends would come back at its floors.
        back = v.frees - lenders.get(v.pod.uid, Resources())
        assert not _fits(plan.requested, floors + back, world.node.allocatable), v.pod.key


@FAST
@given(worlds())
def test_loans_stay_at_or_above_floors_from_lower_priority_lenders(world: World) -> None:
    plan = world.plan()
    by_uid = {p.uid: p for p in world.pods}
    lenders = world.lenders()

    for loan in plan.loans:
        pod = by_uid[loan.pod.uid]
        floor = {(f.container, f.resource): f.amount for f in pod.floors}
        assert pod.priority < world.new.priority
        assert loan.pod.uid in lenders
        assert floor[(loan.container, loan.resource)] <= loan.after < loan.before
        container = pod.container(loan.container)
        assert container is not None
        assert container.requests.get(loan.resource) == loan.before
        assert (pod.qos_class == "Guaranteed") == loan.limits
    # One loan per container and resource; lenders are never victims.
    keys = [(loan.pod.uid, loan.container, loan.resource) for loan in plan.loans]
    assert len(set(keys)) == len(keys)
    assert not {v.pod.uid for v in plan.victims} & {loan.pod.uid for loan in plan.loans}


@FAST
@given(worlds(), st.randoms(use_true_random=False))
def test_deterministic_under_pod_order_and_the_memo(world: World, rnd: Any) -> None:
    plan = world.plan()
    pods = list(world.pods)
    rnd.shuffle(pods)

    assert plan == world.plan(pods)
    view = NodeMemo(world.policy).of(world.node, tuple(pods), tuple(world.budgets), NOW)
    assert plan == plan_resize(
        world.old,
        world.new,
        view,
        now=NOW,
        budgets=world.budgets,
        reservations=world.reservations,
        policy=world.policy,
    )


@FAST
@given(worlds())
def test_lending_off_is_the_plan_without_floors(world: World) -> None:
    # Not "lending only ever spares victims": a more important lender kept at its floors
    # can leave less room for a less important pod, which then goes in its place, as
    # the reprieve protects the more important pods first (docs/lending.md).
    without = world.plan(policy=replace(world.policy, lending=False))

    assert () == without.loans
    assert without == world.plan([replace(p, floors=(), floor_error="") for p in world.pods])
