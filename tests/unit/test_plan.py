"""Victim selection and verdicts: kube-scheduler's SelectVictimsOnNode on the kubelet's
fit model, one rule per case."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.unit.builders import (
    HIGH,
    LOW,
    MID,
    NODE,
    NOW,
    OTHER_NODE,
    ZERO_PRIORITY,
    Gi,
    make_node,
    make_pdb,
    make_pod,
    make_priority_class,
    make_reservation,
    plan,
    uid,
    walkthrough,
)
from webhook.core.accounting import Reservation
from webhook.core.model import NODE_OPT_OUT_ANNOTATION, DisruptionBudget, Node, Pod, PodRef
from webhook.core.objects import PriorityResolver
from webhook.core.plan import Plan, ResourceFigures, fits, shortfall
from webhook.core.policy import DefaultPolicy, PreemptionPolicy
from webhook.core.report import warnings_for
from webhook.core.resources import Resources


@dataclass
class Scene:
    old: Pod
    new: Pod
    node: Node
    pods: list[Pod] = field(default_factory=list)
    budgets: list[DisruptionBudget] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    policy: PreemptionPolicy | None = None

    def plan(self) -> Plan:
        return plan(
            self.old,
            self.new,
            self.node,
            self.pods,
            budgets=self.budgets,
            reservations=self.reservations,
            policy=self.policy,
        )


def node8() -> Node:
    return make_node(NODE).allocatable(cpu="8", memory="16Gi").build()


def resizing(cpu_from: str, cpu_to: str, priority: int = HIGH) -> tuple[Pod, Pod]:
    """The pod being resized: ``cpu_from`` -> ``cpu_to``, admitted at its current size."""
    return (
        make_pod("resizing")
        .priority(priority)
        .requests(cpu=cpu_from)
        .started(50)
        .admitted()
        .resize(cpu=cpu_to)
    )


def pod(name: str, cpu: str, priority: int = LOW, start: float = 100, ns: str = "default") -> Pod:
    return make_pod(name, ns).priority(priority).requests(cpu=cpu).started(start).admitted().build()


def walk() -> Scene:
    old, new, node, pods = walkthrough()
    return Scene(old, new, node, pods)


# -- the cases --------------------------------------------------------------------------
# Each builds a scene; the table below names the expected verdict, code and victims.


def fits_without_preemption() -> Scene:
    old, new = resizing("4", "5")
    return Scene(old, new, node8(), [pod("low-priority-pod", "3")])


def equal_priority_is_never_a_victim() -> Scene:
    old, new = resizing("4", "6")
    return Scene(old, new, node8(), [pod("peer", "3", priority=HIGH)])


def higher_priority_is_never_a_victim() -> Scene:
    old, new = resizing("4", "6", priority=MID)
    return Scene(old, new, node8(), [pod("boss", "3", priority=HIGH)])


def lower_priority_goes_before_higher() -> Scene:
    old, new = resizing("1", "3")
    return Scene(old, new, node8(), [pod("mid", "3", priority=MID), pod("low", "3")])


def tie_broken_by_start_time_newer_goes() -> Scene:
    old, new = resizing("1", "3")
    return Scene(old, new, node8(), [pod("older", "3", start=100), pod("newer", "3", start=200)])


def no_start_time_counts_as_now() -> Scene:
    old, new = resizing("1", "3")
    not_started = make_pod("not-started").priority(LOW).requests(cpu="3").not_started().build()
    return Scene(old, new, node8(), [pod("started", "3", start=9_000), not_started])


def start_time_after_now_is_newer_than_not_started() -> Scene:
    old, new = resizing("1", "3")
    not_started = make_pod("not-started").priority(LOW).requests(cpu="3").not_started().build()
    return Scene(old, new, node8(), [pod("future", "3", start=20_000), not_started])


def full_tie_broken_by_namespace_and_name() -> Scene:
    old, new = resizing("1", "3")
    return Scene(old, new, node8(), [pod("b", "3", ns="x"), pod("a", "3", ns="y")])


def reprieve_keeps_the_more_important_pod() -> Scene:
    old, new = resizing("2", "6")
    return Scene(old, new, node8(), [pod("mid-small", "1", priority=MID), pod("low-big", "3")])


def reprieve_keeps_a_smaller_less_important_pod() -> Scene:
    old, new = resizing("2", "7")
    node = make_node(NODE).allocatable(cpu="10").build()
    pods = [
        pod("mid", "2", priority=MID),
        pod("low-older", "2", start=100),
        pod("low-newer", "1", start=200),
    ]
    return Scene(old, new, node, pods)


def pdb_protected_pod_spared_when_another_will_do() -> Scene:
    old, new = resizing("1", "3")
    protected = make_pod("newer").priority(LOW).requests(cpu="3").labels(app="db").started(200)
    return Scene(
        old,
        new,
        node8(),
        [pod("older", "3", start=100), protected.build()],
        budgets=[make_pdb("db").selecting(app="db").allowing(0).build()],
    )


def pdb_violation_needed_respect_mode() -> Scene:
    old, new = resizing("1", "3")
    guarded = make_pod("db").priority(LOW).requests(cpu="3").labels(app="db").started(100)
    return Scene(
        old,
        new,
        node8(),
        [guarded.build(), pod("peer", "3", priority=HIGH)],
        budgets=[make_pdb("db").selecting(app="db").allowing(0).build()],
    )


def pdb_violation_needed_best_effort_mode() -> Scene:
    scene = pdb_violation_needed_respect_mode()
    scene.policy = DefaultPolicy(pdb_mode="best-effort")
    return scene


def pdb_with_a_disruption_left_allows_one() -> Scene:
    scene = pdb_violation_needed_respect_mode()
    scene.budgets = [make_pdb("db").selecting(app="db").allowing(1).build()]
    return scene


def pdb_budget_spent_by_two_victims() -> Scene:
    old, new = resizing("1", "6")
    db = [
        make_pod(f"db-{i}").priority(LOW).requests(cpu="2").labels(app="db").started(100 + i)
        for i in range(2)
    ]
    return Scene(
        old,
        new,
        node8(),
        [p.build() for p in db] + [pod("peer", "2", priority=HIGH)],
        budgets=[make_pdb("db").selecting(app="db").allowing(1).build()],
    )


def pdb_already_disrupted_pod_spends_nothing() -> Scene:
    scene = pdb_violation_needed_respect_mode()
    scene.budgets = [make_pdb("db").selecting(app="db").allowing(0).disrupted("db").build()]
    return scene


def pdb_of_another_namespace_does_not_cover() -> Scene:
    scene = pdb_violation_needed_respect_mode()
    scene.budgets = [make_pdb("db", "elsewhere").selecting(app="db").allowing(0).build()]
    return scene


def pdb_empty_selector_respect_mode_covers_namespace() -> Scene:
    scene = pdb_violation_needed_respect_mode()
    scene.budgets = [make_pdb("all").empty_selector().allowing(0).build()]
    return scene


def pdb_empty_selector_best_effort_covers_nothing() -> Scene:
    scene = pdb_empty_selector_respect_mode_covers_namespace()
    scene.policy = DefaultPolicy(pdb_mode="best-effort")
    return scene


def pdb_null_selector_covers_nothing() -> Scene:
    scene = pdb_violation_needed_respect_mode()
    scene.budgets = [make_pdb("none").null_selector().allowing(0).build()]
    return scene


def pdb_expression_selector() -> Scene:
    scene = pdb_violation_needed_respect_mode()
    scene.budgets = [make_pdb("db").null_selector().expression("app", "In", "db").build()]
    return scene


def pdb_counts_only_pods_actually_evicted() -> Scene:
    # The PDB allows one disruption and covers both pods. Upstream's split charges it to
    # the more important pod first, so the big newer pod looks "violating"; but the
    # reprieve keeps the small older one, so evicting the big one alone is within budget.
    old, new = resizing("2", "5")
    small = make_pod("small-older").priority(LOW).requests(cpu="1").labels(app="x").started(10)
    big = make_pod("big-newer").priority(LOW).requests(cpu="4").labels(app="x").started(20)
    return Scene(
        old,
        new,
        node8(),
        [small.build(), big.build()],
        budgets=[make_pdb("x").selecting(app="x").allowing(1).build()],
    )


def never_on_the_pod() -> Scene:
    old, new, node, pods = walkthrough()
    old, new = (
        make_pod("high-priority-pod")
        .priority(HIGH)
        .never_preempts()
        .requests(cpu="4", memory="1Gi")
        .admitted()
        .resize(cpu="6", memory="1Gi")
    )
    return Scene(old, new, node, pods)


def never_from_the_priority_class() -> Scene:
    _, _, node, pods = walkthrough()
    resolver = PriorityResolver([make_priority_class("polite", HIGH).never_preempts().build()])
    old, new = (
        make_pod("high-priority-pod")
        .priority(None)
        .priority_class("polite")
        .requests(cpu="4")
        .admitted()
        .resize(cpu="6", resolver=resolver)
    )
    return Scene(old, new, node, pods)


def never_but_fits() -> Scene:
    scene = never_on_the_pod()
    scene.pods = []
    return scene


def priority_from_the_class_preempts() -> Scene:
    _, _, node, _ = walkthrough()
    resolver = PriorityResolver(
        [
            make_priority_class("critical", HIGH).build(),
            make_priority_class("batch", LOW).global_default().build(),
        ]
    )
    low = make_pod("batch-job").priority(None).requests(cpu="3").started(1).build(resolver)
    old, new = (
        make_pod("web")
        .priority(None)
        .priority_class("critical")
        .requests(cpu="4")
        .admitted()
        .resize(cpu="6", resolver=resolver)
    )
    return Scene(old, new, node, [low])


def beyond_allocatable() -> Scene:
    old, new = resizing("4", "9")
    return Scene(old, new, node8(), [pod("low", "3")])


def beyond_allocatable_memory() -> Scene:
    old, new = (
        make_pod("resizing").priority(HIGH).requests(memory="1Gi").admitted().resize(memory="17Gi")
    )
    return Scene(old, new, node8())


def infeasible_even_with_every_victim() -> Scene:
    old, new = resizing("4", "7")
    return Scene(old, new, node8(), [pod("low", "1"), pod("peer", "3", priority=HIGH)])


def pending_resize_of_another_pod_not_counted_at_desired() -> Scene:
    old, new = resizing("2", "5")
    deferred = (
        make_pod("deferred-peer")
        .priority(HIGH)
        .requests(cpu="5")
        .status("app", allocated={"cpu": "2"}, actual={"cpu": "2"})
        .resize_pending("Deferred")
        .build()
    )
    return Scene(old, new, node8(), [deferred, pod("low", "1")])


def resizing_pod_at_max_of_desired_allocated_actual() -> Scene:
    # Allocated 3 but the runtime still applies 5 (a shrink not yet actuated): the
    # memory growth must fit next to 5 CPU, so the 4-CPU pod has to go.
    old, new = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="3", memory="1Gi")
        .status(
            "app", allocated={"cpu": "3", "memory": "1Gi"}, actual={"cpu": "5", "memory": "1Gi"}
        )
        .resize(memory="2Gi")
    )
    return Scene(old, new, node8(), [pod("low", "4")])


def stale_infeasible_resize_is_ignored() -> Scene:
    stored = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="7")
        .status("app", allocated={"cpu": "4"}, actual={"cpu": "4"})
        .resize_pending("Infeasible")
        .build()
    )
    return Scene(stored, stored, node8(), [pod("low", "3")])


def changed_infeasible_resize_is_planned() -> Scene:
    old, new = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="7")
        .status("app", allocated={"cpu": "4"}, actual={"cpu": "4"})
        .resize_pending("Infeasible")
        .resize(cpu="6")
    )
    return Scene(old, new, node8(), [pod("low", "3")])


def deferred_resize_already_persisted() -> Scene:
    stored = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="6")
        .status("app", allocated={"cpu": "4"}, actual={"cpu": "4"})
        .resize_pending("Deferred")
        .build()
    )
    return Scene(stored, stored, node8(), [pod("low", "3")])


def sidecar_and_overhead_count_for_the_resizing_pod() -> Scene:
    old, new = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="4")
        .sidecar("proxy", cpu="1")
        .overhead(cpu="500m")
        .admitted()
        .resize(cpu="5")
    )
    return Scene(old, new, node8(), [pod("low", "2")])


def overhead_alone_still_fits() -> Scene:
    old, new = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="4")
        .overhead(cpu="500m")
        .admitted()
        .resize(cpu="5")
    )
    return Scene(old, new, node8(), [pod("low", "2")])


def victim_frees_its_init_peak_and_overhead() -> Scene:
    old, new = resizing("1", "5")
    victim = (
        make_pod("low")
        .priority(LOW)
        .requests(cpu="1")
        .init_container("setup", cpu="3")
        .overhead(cpu="500m")
        .started(1)
        .build()
    )
    return Scene(old, new, node8(), [victim])


def pod_level_resize() -> Scene:
    old, new = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="1")
        .pod_resources(cpu="4")
        .pod_status_resources(allocated=Resources(4000, 0), actual=Resources(4000, 0))
        .admitted()
        .resize_with({"spec": {"resources": {"requests": {"cpu": "6"}}}})
    )
    return Scene(old, new, node8(), [pod("low", "3")])


def victim_without_container_status_at_spec() -> Scene:
    old, new = resizing("4", "6")
    pending = make_pod("pending-low").priority(LOW).requests(cpu="3").phase("Pending").build()
    return Scene(old, new, node8(), [pending])


def unadmittable_pod_does_not_block() -> Scene:
    """Bound, not admitted, and larger than the node: the kubelet will reject it."""
    old, new = resizing("4", "6")
    huge = make_pod("huge").priority(HIGH).requests(cpu="10").phase("Pending").build()
    return Scene(old, new, node8(), [huge])


def unadmittable_pod_is_not_preempted_for_room_it_does_not_hold() -> Scene:
    old, new = resizing("4", "6")
    huge = make_pod("huge").priority(LOW).requests(cpu="10").phase("Pending").build()
    return Scene(old, new, node8(), [huge, pod("low", "1")])


def terminal_pods_hold_nothing() -> Scene:
    old, new = resizing("4", "6")
    done = make_pod("done").priority(LOW).requests(cpu="3").phase("Succeeded").build()
    failed = make_pod("failed").priority(LOW).requests(cpu="3").phase("Failed").build()
    return Scene(old, new, node8(), [done, failed])


def mirror_pods_are_never_victims() -> Scene:
    old, new = resizing("4", "6")
    static = make_pod("static").priority(LOW).requests(cpu="3").mirror().build()
    return Scene(old, new, node8(), [static])


def victims_never_on_another_node() -> Scene:
    old, new = resizing("4", "6")
    elsewhere = make_pod("elsewhere").priority(ZERO_PRIORITY).requests(cpu="3").on(OTHER_NODE)
    return Scene(old, new, node8(), [elsewhere.build(), pod("here", "3", priority=MID)])


def only_pods_on_another_node() -> Scene:
    old, new = resizing("4", "9")
    node = make_node(NODE).allocatable(cpu="10").build()
    far = make_pod("far").priority(ZERO_PRIORITY).requests(cpu="8").on(OTHER_NODE).build()
    return Scene(old, new, node, [far, pod("near", "2", priority=HIGH)])


def victims_from_any_namespace() -> Scene:
    old, new = resizing("4", "6")
    return Scene(old, new, node8(), [pod("batch-job", "3", ns="batch")])


def protected_namespace_spared() -> Scene:
    old, new = resizing("1", "3")
    return Scene(
        old,
        new,
        node8(),
        [pod("agent", "3", priority=ZERO_PRIORITY, ns="kube-system"), pod("low", "3")],
        policy=DefaultPolicy(protected_namespaces=frozenset({"kube-system"})),
    )


def protected_namespace_only() -> Scene:
    scene = walk()
    scene.pods = [pod("agent", "3", ns="kube-system")]
    scene.policy = DefaultPolicy(protected_namespaces=frozenset({"kube-system"}))
    return scene


def two_victims_needed() -> Scene:
    old, new = resizing("2", "6")
    return Scene(
        old, new, node8(), [pod("a", "2", start=1), pod("b", "2", start=2), pod("c", "1", start=3)]
    )


def max_victims_exceeded() -> Scene:
    scene = two_victims_needed()
    scene.policy = DefaultPolicy(max_victims=1)
    return scene


def max_victims_met() -> Scene:
    scene = two_victims_needed()
    scene.policy = DefaultPolicy(max_victims=2)
    return scene


def max_victims_zero() -> Scene:
    scene = walk()
    scene.policy = DefaultPolicy(max_victims=0)
    return scene


def reservation_of_unseen_pod_reduces_headroom() -> Scene:
    old, new = resizing("4", "6")
    return Scene(
        old, new, node8(), [pod("low", "1")], reservations=[make_reservation("unseen", cpu="2")]
    )


def reservation_raises_a_seen_pod() -> Scene:
    old, new = resizing("4", "6")
    return Scene(
        old,
        new,
        node8(),
        [pod("peer", "1", priority=HIGH), pod("low", "1")],
        reservations=[make_reservation("peer", cpu="2")],
    )


def expired_reservation_ignored() -> Scene:
    scene = reservation_of_unseen_pod_reduces_headroom()
    scene.reservations = [make_reservation("unseen", cpu="2", expires_in=-1)]
    return scene


def own_reservation_ignored() -> Scene:
    scene = reservation_of_unseen_pod_reduces_headroom()
    scene.reservations = [make_reservation("resizing", cpu="6")]
    return scene


def reservation_on_another_node_ignored() -> Scene:
    scene = reservation_of_unseen_pod_reduces_headroom()
    scene.reservations = [make_reservation("unseen", cpu="2", node=OTHER_NODE)]
    return scene


def claimed_victim_not_reselected() -> Scene:
    # "peer" was admitted to grow 1 -> 4 by evicting "claimed" (3 CPU). Its room is held
    # by its reservation; "claimed" is on its way out and may not be chosen again.
    old, new = resizing("2", "4")
    pods = [pod("peer", "1", priority=HIGH), pod("claimed", "3", start=1), pod("other", "1")]
    reservation = make_reservation("peer", cpu="4", victims=[uid("claimed")])
    return Scene(old, new, node8(), pods, reservations=[reservation])


def claimed_victim_capacity_not_double_counted() -> Scene:
    scene = claimed_victim_not_reselected()
    scene.pods = scene.pods[:2]
    return scene


def claim_of_expired_reservation_lapses() -> Scene:
    old, new = resizing("2", "5")
    pods = [pod("peer", "1", priority=HIGH), pod("claimed", "3", start=1)]
    reservation = make_reservation("peer", cpu="4", victims=[uid("claimed")], expires_in=-1)
    return Scene(old, new, node8(), pods, reservations=[reservation])


def terminating_pod_fits_once_terminated() -> Scene:
    old, new = resizing("4", "6")
    leaving = make_pod("low-priority-pod").priority(LOW).requests(cpu="3").terminating().build()
    return Scene(old, new, node8(), [leaving])


def terminating_pod_not_reselected() -> Scene:
    old, new = resizing("4", "7")
    leaving = make_pod("leaving").priority(LOW).requests(cpu="2").terminating().build()
    return Scene(old, new, node8(), [leaving, pod("low", "2")])


def node_opted_out_by_field() -> Scene:
    scene = walk()
    scene.node = make_node(NODE).allocatable(cpu="8", memory="16Gi").opted_out().build()
    return scene


def node_opted_out_by_annotation() -> Scene:
    scene = walk()
    scene.node = (
        make_node(NODE)
        .allocatable(cpu="8", memory="16Gi")
        .annotate(NODE_OPT_OUT_ANNOTATION, "true")
        .build()
    )
    return scene


def pod_condition_preemption_disabled() -> Scene:
    scene = walk()
    scene.old, scene.new = (
        make_pod("high-priority-pod")
        .priority(HIGH)
        .requests(cpu="4")
        .admitted()
        .resize_preemption_disabled()
        .resize(cpu="6")
    )
    return scene


def opted_out_node_but_fits() -> Scene:
    scene = fits_without_preemption()
    scene.node = make_node(NODE).allocatable(cpu="8").opted_out().build()
    return scene


def shrink_is_no_growth() -> Scene:
    old, new = resizing("4", "2")
    return Scene(old, new, node8(), [pod("low", "3")])


def same_size_is_no_growth() -> Scene:
    old, new = resizing("4", "4")
    return Scene(old, new, node8())


def limits_only_is_no_growth() -> Scene:
    old, new = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu="4")
        .limits(cpu="4")
        .admitted()
        .resize_with(
            {"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "8"}}}]}}
        )
    )
    return Scene(old, new, node8(), [pod("low", "3")])


def not_bound() -> Scene:
    old, new = make_pod("resizing").priority(HIGH).requests(cpu="1").unbound().resize(cpu="2")
    return Scene(old, new, node8())


def memory_growth_ignores_overcommitted_cpu() -> Scene:
    old, new = (
        make_pod("resizing").priority(HIGH).requests(memory="1Gi").admitted().resize(memory="2Gi")
    )
    return Scene(old, new, node8(), [pod("busy", "9", priority=HIGH)])


def memory_shortfall_preempts() -> Scene:
    old, new = (
        make_pod("resizing").priority(HIGH).requests(memory="8Gi").admitted().resize(memory="12Gi")
    )
    hog = make_pod("hog").priority(LOW).requests(memory="6Gi").started(1).build()
    small = make_pod("small").priority(LOW).requests(memory="1Gi").started(2).build()
    return Scene(old, new, node8(), [hog, small])


def eviction_order_least_important_first() -> Scene:
    old, new = resizing("1", "6")
    return Scene(
        old,
        new,
        node8(),
        [
            pod("mid", "2", priority=MID),
            pod("low-older", "2", start=1),
            pod("zero", "2", priority=ZERO_PRIORITY),
            pod("low-newer", "1", start=2),
        ],
    )


def cpu_moved_between_containers_needs_no_room() -> Scene:
    """Upstream ``PodRequests``: max of the aggregates (3 CPU), not the sum of
    per-container maxima (4 CPU)."""
    node = make_node(NODE).allocatable(cpu="4", memory="16Gi").build()
    old, new = (
        make_pod("p")
        .priority(1000)
        .requests(cpu="2", container="c1")
        .requests(cpu="1", container="c2")
        .started(50)
        .admitted()
        .resize_with(
            {
                "spec": {
                    "containers": [
                        {"name": "c1", "resources": {"requests": {"cpu": "1"}}},
                        {"name": "c2", "resources": {"requests": {"cpu": "2"}}},
                    ]
                }
            }
        )
    )
    return Scene(old, new, node, [pod("low", "1", priority=0)])


W = "default/"
CASES: list[tuple[Callable[[], Scene], str, str, tuple[str, ...]]] = [
    (walk, "preempt", "preempt", (W + "low-priority-pod",)),
    (fits_without_preemption, "fits", "fits", ()),
    (equal_priority_is_never_a_victim, "infeasible", "insufficient-after-preemption", ()),
    (higher_priority_is_never_a_victim, "infeasible", "insufficient-after-preemption", ()),
    (lower_priority_goes_before_higher, "preempt", "preempt", (W + "low",)),
    (tie_broken_by_start_time_newer_goes, "preempt", "preempt", (W + "newer",)),
    (no_start_time_counts_as_now, "preempt", "preempt", (W + "not-started",)),
    (start_time_after_now_is_newer_than_not_started, "preempt", "preempt", (W + "future",)),
    (full_tie_broken_by_namespace_and_name, "preempt", "preempt", ("y/a",)),
    (reprieve_keeps_the_more_important_pod, "preempt", "preempt", (W + "low-big",)),
    (reprieve_keeps_a_smaller_less_important_pod, "preempt", "preempt", (W + "low-older",)),
    (pdb_protected_pod_spared_when_another_will_do, "preempt", "preempt", (W + "older",)),
    (pdb_violation_needed_respect_mode, "infeasible", "pdb-violation", ()),
    (pdb_violation_needed_best_effort_mode, "preempt", "preempt", (W + "db",)),
    (pdb_with_a_disruption_left_allows_one, "preempt", "preempt", (W + "db",)),
    (pdb_budget_spent_by_two_victims, "infeasible", "pdb-violation", ()),
    (pdb_already_disrupted_pod_spends_nothing, "preempt", "preempt", (W + "db",)),
    (pdb_of_another_namespace_does_not_cover, "preempt", "preempt", (W + "db",)),
    (pdb_empty_selector_respect_mode_covers_namespace, "infeasible", "pdb-violation", ()),
    (pdb_empty_selector_best_effort_covers_nothing, "preempt", "preempt", (W + "db",)),
    (pdb_null_selector_covers_nothing, "preempt", "preempt", (W + "db",)),
    (pdb_expression_selector, "infeasible", "pdb-violation", ()),
    (pdb_counts_only_pods_actually_evicted, "preempt", "preempt", (W + "big-newer",)),
    (never_on_the_pod, "not-eligible", "preemption-policy-never", ()),
    (never_from_the_priority_class, "not-eligible", "preemption-policy-never", ()),
    (never_but_fits, "fits", "fits", ()),
    (priority_from_the_class_preempts, "preempt", "preempt", (W + "batch-job",)),
    (beyond_allocatable, "infeasible", "exceeds-allocatable", ()),
    (beyond_allocatable_memory, "infeasible", "exceeds-allocatable", ()),
    (infeasible_even_with_every_victim, "infeasible", "insufficient-after-preemption", ()),
    (pending_resize_of_another_pod_not_counted_at_desired, "fits", "fits", ()),
    (resizing_pod_at_max_of_desired_allocated_actual, "preempt", "preempt", (W + "low",)),
    (stale_infeasible_resize_is_ignored, "fits", "no-growth", ()),
    (changed_infeasible_resize_is_planned, "preempt", "preempt", (W + "low",)),
    (deferred_resize_already_persisted, "preempt", "preempt", (W + "low",)),
    (sidecar_and_overhead_count_for_the_resizing_pod, "preempt", "preempt", (W + "low",)),
    (overhead_alone_still_fits, "fits", "fits", ()),
    (victim_frees_its_init_peak_and_overhead, "preempt", "preempt", (W + "low",)),
    (pod_level_resize, "preempt", "preempt", (W + "low",)),
    (victim_without_container_status_at_spec, "preempt", "preempt", (W + "pending-low",)),
    (unadmittable_pod_does_not_block, "fits", "fits", ()),
    (unadmittable_pod_is_not_preempted_for_room_it_does_not_hold, "fits", "fits", ()),
    (terminal_pods_hold_nothing, "fits", "fits", ()),
    (mirror_pods_are_never_victims, "infeasible", "insufficient-after-preemption", ()),
    (victims_never_on_another_node, "preempt", "preempt", (W + "here",)),
    (only_pods_on_another_node, "infeasible", "insufficient-after-preemption", ()),
    (victims_from_any_namespace, "preempt", "preempt", ("batch/batch-job",)),
    (protected_namespace_spared, "preempt", "preempt", (W + "low",)),
    (protected_namespace_only, "infeasible", "insufficient-after-preemption", ()),
    (two_victims_needed, "preempt", "preempt", (W + "c", W + "b")),
    (max_victims_exceeded, "infeasible", "too-many-victims", ()),
    (max_victims_met, "preempt", "preempt", (W + "c", W + "b")),
    (max_victims_zero, "infeasible", "too-many-victims", ()),
    (reservation_of_unseen_pod_reduces_headroom, "preempt", "preempt", (W + "low",)),
    (reservation_raises_a_seen_pod, "preempt", "preempt", (W + "low",)),
    (expired_reservation_ignored, "fits", "fits", ()),
    (own_reservation_ignored, "fits", "fits", ()),
    (reservation_on_another_node_ignored, "fits", "fits", ()),
    (claimed_victim_not_reselected, "preempt", "preempt", (W + "other",)),
    (claimed_victim_capacity_not_double_counted, "fits", "fits-once-terminated", ()),
    (claim_of_expired_reservation_lapses, "preempt", "preempt", (W + "claimed",)),
    (terminating_pod_fits_once_terminated, "fits", "fits-once-terminated", ()),
    (terminating_pod_not_reselected, "preempt", "preempt", (W + "low",)),
    (node_opted_out_by_field, "not-eligible", "node-opted-out", ()),
    (node_opted_out_by_annotation, "not-eligible", "node-opted-out", ()),
    (pod_condition_preemption_disabled, "not-eligible", "node-opted-out", ()),
    (opted_out_node_but_fits, "fits", "fits", ()),
    (shrink_is_no_growth, "fits", "no-growth", ()),
    (same_size_is_no_growth, "fits", "no-growth", ()),
    (limits_only_is_no_growth, "fits", "no-growth", ()),
    (not_bound, "not-eligible", "not-bound", ()),
    (memory_growth_ignores_overcommitted_cpu, "fits", "fits", ()),
    (memory_shortfall_preempts, "preempt", "preempt", (W + "hog",)),
    (cpu_moved_between_containers_needs_no_room, "fits", "no-growth", ()),
    (
        eviction_order_least_important_first,
        "preempt",
        "preempt",
        (W + "zero", W + "low-newer", W + "low-older"),
    ),
]


@pytest.mark.parametrize(
    ("scene", "verdict", "code", "victims"),
    [pytest.param(*case, id=case[0].__name__.replace("_", "-")) for case in CASES],
)
def test_plan_rule(
    scene: Callable[[], Scene], verdict: str, code: str, victims: tuple[str, ...]
) -> None:
    result = scene().plan()

    assert (verdict, code, victims) == (result.verdict, result.code, result.victim_keys)
    if result.verdict != "preempt":
        assert () == result.victims


# -- details of particular verdicts ----------------------------------------------------


def test_walkthrough_figures_and_reason() -> None:
    result = walk().plan()

    assert "preempting 1 lower-priority pod on node-1 to free cpu 1" == result.reason
    assert Resources(6000, Gi) == result.requested
    assert result.figures is not None
    assert ResourceFigures(6000, 3000, 0, 8000, 1000) == result.figures["cpu"]
    assert Resources(1000, 0) == result.shortfall
    assert Resources() == result.unmet
    (victim,) = result.victims
    assert (PodRef("default", "low-priority-pod", uid("low-priority-pod")), LOW) == (
        victim.pod,
        victim.priority,
    )
    assert Resources(3000, 500 * 2**20) == victim.frees
    assert not victim.violates_pdb


def test_infeasible_after_preemption_reports_what_is_missing() -> None:
    result = infeasible_even_with_every_victim().plan()

    assert Resources(2000, 0) == result.unmet
    assert "cpu short by 2" in result.reason


def _growing(cpu: tuple[str, str], memory: tuple[str, str]) -> tuple[Pod, Pod]:
    return (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu=cpu[0], memory=memory[0])
        .started(50)
        .admitted()
        .resize(cpu=cpu[1], memory=memory[1])
    )


def _held(name: str, cpu: str, memory: str, priority: int = LOW) -> Pod:
    return make_pod(name).priority(priority).requests(cpu=cpu, memory=memory).started(100).build()


@pytest.mark.parametrize(
    "cpu, memory, other_priority, reason, warning",
    [
        pytest.param(
            ("4", "6"),
            ("4Gi", "10Gi"),
            LOW,
            "preempting 1 lower-priority pod on node-1 to free cpu 1, memory 2Gi",
            "preempting 1 lower-priority pod on node-1 for cpu 6, memory 10Gi: default/other",
            id="short-of-both",
        ),
        pytest.param(
            ("4", "4"),
            ("4Gi", "10Gi"),
            LOW,
            "preempting 1 lower-priority pod on node-1 to free memory 2Gi",
            "preempting 1 lower-priority pod on node-1 for memory 10Gi: default/other",
            id="short-of-memory-only",
        ),
        pytest.param(
            ("4", "6"),
            ("4Gi", "10Gi"),
            HIGH,
            "cannot fit on node-1 even after preempting every lower-priority pod: "
            "cpu short by 1, memory short by 2Gi",
            "cannot fit on node-1 even after preempting every lower-priority pod: "
            "cpu short by 1, memory short by 2Gi",
            id="infeasible-names-both",
        ),
    ],
)
def test_messages_name_each_resource_short(
    cpu: tuple[str, str], memory: tuple[str, str], other_priority: int, reason: str, warning: str
) -> None:
    old, new = _growing(cpu, memory)
    result = Scene(old, new, node8(), [_held("other", "3", "8Gi", other_priority)]).plan()

    assert reason == result.reason
    assert [warning] == warnings_for(result)


def test_exceeds_allocatable_names_the_resource() -> None:
    result = beyond_allocatable().plan()

    assert "requests exceed node-1 allocatable: cpu 9 > 8" == result.reason


def test_pdb_violation_names_the_blocked_pod() -> None:
    result = pdb_violation_needed_respect_mode().plan()

    assert "default/db" in result.reason


def test_best_effort_marks_the_violating_victim() -> None:
    result = pdb_violation_needed_best_effort_mode().plan()

    assert [True] == [v.violates_pdb for v in result.victims]


def test_victims_within_budget_are_not_marked() -> None:
    result = pdb_counts_only_pods_actually_evicted().plan()

    assert [False] == [v.violates_pdb for v in result.victims]


def test_best_effort_marks_only_the_victims_past_the_budget() -> None:
    scene = pdb_budget_spent_by_two_victims()
    scene.policy = DefaultPolicy(pdb_mode="best-effort")
    result = scene.plan()

    # Evicted least important first: the first eviction spends the one disruption.
    assert (("default/db-1", False), ("default/db-0", True)) == tuple(
        (v.pod.key, v.violates_pdb) for v in result.victims
    )


def test_terminating_pods_are_reported_as_waited_for() -> None:
    result = terminating_pod_fits_once_terminated().plan()

    assert "fits on node-1 once 1 pod already leaving has gone" == result.reason
    assert ("default/low-priority-pod",) == tuple(r.key for r in result.waiting_for)
    assert result.figures is not None
    assert 3000 == result.figures["cpu"].freeing


def test_never_reason_names_the_shortfall() -> None:
    result = never_on_the_pod().plan()

    assert "preemptionPolicy is Never; cpu short by 1 on node-1" == result.reason


def test_plan_does_not_depend_on_pod_order() -> None:
    scene = eviction_order_least_important_first()
    forward = scene.plan()
    scene.pods.reverse()

    assert forward == scene.plan()


def test_time_moves_reservations_out() -> None:
    scene = reservation_of_unseen_pod_reduces_headroom()

    assert "preempt" == scene.plan().verdict
    later = plan(
        scene.old,
        scene.new,
        scene.node,
        scene.pods,
        reservations=scene.reservations,
        now=NOW + 3600,
    )
    assert "fits" == later.verdict


@pytest.mark.parametrize(
    ("demand", "used", "allocatable", "expected"),
    [
        pytest.param(
            Resources(2000, 0), Resources(7000, 0), Resources(8000, 0), Resources(1000, 0), id="cpu"
        ),
        pytest.param(
            Resources(0, Gi),
            Resources(9000, 0),
            Resources(8000, Gi),
            Resources(),
            id="unrequested-cpu-not-checked",
        ),
        pytest.param(
            Resources(1, Gi),
            Resources(0, 2 * Gi),
            Resources(8000, 2 * Gi),
            Resources(0, Gi),
            id="memory",
        ),
        pytest.param(
            Resources(1000, 0), Resources(), Resources(8000, 0), Resources(), id="room-left"
        ),
    ],
)
def test_shortfall(
    demand: Resources, used: Resources, allocatable: Resources, expected: Resources
) -> None:
    assert expected == shortfall(demand, used, allocatable)
    assert expected.is_zero() == fits(demand, used, allocatable)
