"""Lending: pods with a floor annotation shrink in place before anyone is evicted.

One table row per rule of docs/lending.md; the expected verdict, code, victims and loans
(``pod container resource from->to``) are on the left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.builders import (
    HIGH,
    LOW,
    MID,
    NODE,
    ZERO_PRIORITY,
    PodBuilder,
    make_node,
    make_pod,
    make_reservation,
    plan,
)
from webhook.core.accounting import Reservation
from webhook.core.lending import Loan, borrow, held, lowered, room
from webhook.core.model import Node, Pod
from webhook.core.plan import Plan
from webhook.core.policy import DefaultPolicy, PreemptionPolicy
from webhook.core.resources import Resources


@dataclass
class Scene:
    old: Pod
    new: Pod
    node: Node
    pods: list[Pod]
    policy: PreemptionPolicy | None = None
    reservations: tuple[Reservation, ...] = ()

    def plan(self) -> Plan:
        return plan(
            self.old,
            self.new,
            self.node,
            self.pods,
            policy=self.policy,
            reservations=self.reservations,
        )


def node(cpu: str = "8", memory: str = "16Gi") -> Node:
    return make_node(NODE).allocatable(cpu=cpu, memory=memory).build()


def resizing(cpu_from: str, cpu_to: str, memory: str = "1Gi", to_memory: str = "") -> Scene:
    old, new = (
        make_pod("resizing")
        .priority(HIGH)
        .requests(cpu=cpu_from, memory=memory)
        .started(50)
        .admitted()
        .resize(cpu=cpu_to, memory=to_memory or memory)
    )
    return Scene(old, new, node(), [])


def lender(name: str, cpu: str, memory: str = "1Gi", priority: int = LOW) -> PodBuilder:
    return make_pod(name).priority(priority).requests(cpu=cpu, memory=memory).started(100)


def with_pods(scene: Scene, *pods: Pod) -> Scene:
    scene.pods = list(pods)
    return scene


# -- the cases --------------------------------------------------------------------------


def walkthrough_lends_instead_of_evicting() -> Scene:
    # 6 + 3 on 8 CPU: short by 1, the lender gives exactly that.
    low = lender("low-priority-pod", "3", "500Mi").floor(cpu="1").admitted().build()
    return with_pods(resizing("4", "6"), low)


def lending_down_to_the_floor() -> Scene:
    low = lender("batch-1", "3").floor(cpu="1").admitted().build()
    return with_pods(resizing("3", "7"), low)


def floor_too_high_to_cover_evicts() -> Scene:
    low = lender("batch-1", "3").floor(cpu="2").admitted().build()
    return with_pods(resizing("3", "7"), low)


def least_important_lender_first() -> Scene:
    low = lender("low", "2").floor(cpu="1").admitted().build()
    mid = lender("mid", "2", priority=MID).floor(cpu="1").admitted().build()
    return with_pods(resizing("2", "5"), mid, low)


def two_lenders_each_only_what_is_still_needed() -> Scene:
    low = lender("low", "2").floor(cpu="1").admitted().build()
    mid = lender("mid", "3", priority=MID).floor(cpu="1").admitted().build()
    return with_pods(resizing("2", "5"), mid, low)


def one_eviction_and_one_loan() -> Scene:
    # Short by 3 with 1 lendable: evict the unannotated pod (2), borrow the last 1.
    keep = lender("keeps", "3").floor(cpu="2").admitted().build()
    goes = lender("goes", "2", priority=ZERO_PRIORITY).admitted().build()
    return with_pods(resizing("2", "6"), keep, goes)


def restart_container_policy_does_not_lend() -> Scene:
    low = (
        lender("restarts", "3")
        .floor(cpu="1")
        .resize_policy("cpu", "RestartContainer")
        .admitted()
        .build()
    )
    return with_pods(resizing("4", "6"), low)


def restart_policy_of_the_other_resource_still_lends() -> Scene:
    low = (
        lender("restarts-on-memory", "3")
        .floor(cpu="1")
        .resize_policy("memory", "RestartContainer")
        .admitted()
        .build()
    )
    return with_pods(resizing("4", "6"), low)


def malformed_floor_is_an_ordinary_candidate() -> Scene:
    low = lender("bad-floor", "3").annotate("resize-preemption.io/floor", "{cpu: 1").admitted()
    return with_pods(resizing("4", "6"), low.build())


def guaranteed_lender_lowers_its_limit() -> Scene:
    low = lender("guaranteed", "3").qos("Guaranteed").floor(cpu="1").admitted().build()
    return with_pods(resizing("4", "6"), low)


def memory_loan() -> Scene:
    low = lender("cache", "1", memory="4Gi").floor(memory="1Gi").admitted().build()
    return with_pods(resizing("1", "1", memory="10Gi", to_memory="13Gi"), low)


def only_the_short_resource_is_lent() -> Scene:
    low = lender("both", "3", memory="4Gi").floor(cpu="1", memory="1Gi").admitted().build()
    return with_pods(resizing("4", "6"), low)


def init_container_peak_limits_what_a_loan_frees() -> Scene:
    # Short by 2. "peaky" holds max(app 3, init 2) = 3: lowering its app container below
    # 2 frees nothing more, so it lends 1 and the more important pod the other 1.
    low = lender("peaky", "3").init_container("setup", cpu="2").floor(cpu="1").admitted()
    mid = lender("plain", "3", priority=MID).floor(cpu="1").admitted().build()
    return with_pods(resizing("2", "4"), low.build(), mid)


def init_container_peak_above_the_app_frees_nothing() -> Scene:
    low = lender("peaky", "3").init_container("setup", cpu="4").floor(cpu="1").admitted()
    return with_pods(resizing("3", "5"), low.build())


def sidecar_lends() -> Scene:
    low = lender("meshed", "2").sidecar("proxy", cpu="2").floor(cpu="1", container="proxy")
    return with_pods(resizing("3", "5"), low.admitted().build())


def equal_priority_never_lends() -> Scene:
    peer = lender("peer", "3", priority=HIGH).floor(cpu="1").admitted().build()
    return with_pods(resizing("4", "6"), peer)


def lending_off_evicts() -> Scene:
    scene = walkthrough_lends_instead_of_evicting()
    scene.policy = DefaultPolicy(lending=False)
    return scene


def pod_with_its_own_reservation_does_not_lend() -> Scene:
    scene = walkthrough_lends_instead_of_evicting()
    scene.reservations = (make_reservation("low-priority-pod", cpu="3", memory="500Mi"),)
    return scene


def protected_namespace_never_lends() -> Scene:
    scene = walkthrough_lends_instead_of_evicting()
    scene.policy = DefaultPolicy(protected_namespaces=frozenset({"default"}))
    return scene


def floor_above_the_request_lends_nothing() -> Scene:
    low = lender("low", "3").floor(cpu="4").admitted().build()
    return with_pods(resizing("4", "6"), low)


CASES: list[tuple[Callable[[], Scene], str, str, list[str], list[str]]] = [
    # scene, verdict, code, victims, loans
    (
        walkthrough_lends_instead_of_evicting,
        "preempt",
        "lend",
        [],
        ["default/low-priority-pod app cpu 3->2"],
    ),
    (lending_down_to_the_floor, "preempt", "lend", [], ["default/batch-1 app cpu 3->1"]),
    (floor_too_high_to_cover_evicts, "preempt", "preempt", ["default/batch-1"], []),
    (least_important_lender_first, "preempt", "lend", [], ["default/low app cpu 2->1"]),
    (
        two_lenders_each_only_what_is_still_needed,
        "preempt",
        "lend",
        [],
        ["default/low app cpu 2->1", "default/mid app cpu 3->2"],
    ),
    (
        one_eviction_and_one_loan,
        "preempt",
        "preempt",
        ["default/goes"],
        ["default/keeps app cpu 3->2"],
    ),
    (restart_container_policy_does_not_lend, "preempt", "preempt", ["default/restarts"], []),
    (
        restart_policy_of_the_other_resource_still_lends,
        "preempt",
        "lend",
        [],
        ["default/restarts-on-memory app cpu 3->2"],
    ),
    (malformed_floor_is_an_ordinary_candidate, "preempt", "preempt", ["default/bad-floor"], []),
    (
        guaranteed_lender_lowers_its_limit,
        "preempt",
        "lend",
        [],
        ["default/guaranteed app cpu 3->2 limit"],
    ),
    (memory_loan, "preempt", "lend", [], ["default/cache app memory 4Gi->3Gi"]),
    (only_the_short_resource_is_lent, "preempt", "lend", [], ["default/both app cpu 3->2"]),
    (
        init_container_peak_limits_what_a_loan_frees,
        "preempt",
        "lend",
        [],
        ["default/peaky app cpu 3->2", "default/plain app cpu 3->2"],
    ),
    (
        init_container_peak_above_the_app_frees_nothing,
        "preempt",
        "preempt",
        ["default/peaky"],
        [],
    ),
    (sidecar_lends, "preempt", "lend", [], ["default/meshed proxy cpu 2->1"]),
    (equal_priority_never_lends, "infeasible", "insufficient-after-preemption", [], []),
    (lending_off_evicts, "preempt", "preempt", ["default/low-priority-pod"], []),
    (
        pod_with_its_own_reservation_does_not_lend,
        "preempt",
        "preempt",
        ["default/low-priority-pod"],
        [],
    ),
    (protected_namespace_never_lends, "infeasible", "insufficient-after-preemption", [], []),
    (floor_above_the_request_lends_nothing, "preempt", "preempt", ["default/low"], []),
]


def loan_text(loan: Loan) -> str:
    from webhook.core.resources import format_amount

    r = loan.resource
    change = f"{format_amount(r, loan.before)}->{format_amount(r, loan.after)}"
    return f"{loan.pod.key} {loan.container} {r} {change}" + (" limit" if loan.limits else "")


@pytest.mark.parametrize(
    ("scene", "verdict", "code", "victims", "loans"),
    [pytest.param(*case, id=case[0].__name__.replace("_", "-")) for case in CASES],
)
def test_lending_rules(
    scene: Callable[[], Scene], verdict: str, code: str, victims: list[str], loans: list[str]
) -> None:
    result = scene().plan()

    assert (verdict, code) == (result.verdict, result.code), result.reason
    assert victims == list(result.victim_keys)
    assert loans == [loan_text(loan) for loan in result.loans]


@pytest.mark.parametrize(
    ("expected", "pod"),
    [
        pytest.param(Resources(), lender("plain", "3").admitted(), id="no-floor"),
        pytest.param(Resources(2000), lender("a", "3").floor(cpu="1").admitted(), id="cpu"),
        pytest.param(
            Resources(2000, 3 * 2**30),
            lender("a", "3", "4Gi").floor(cpu="1", memory="1Gi").admitted(),
            id="cpu-and-memory",
        ),
        pytest.param(
            Resources(1000),
            lender("a", "3").init_container("setup", cpu="2").floor(cpu="1").admitted(),
            id="init-container-peak",
        ),
        pytest.param(
            Resources(),
            lender("a", "3").pod_resources(cpu="3").floor(cpu="1").admitted(),
            id="pod-level-requests-stay",
        ),
        pytest.param(
            Resources(1000),
            lender("a", "3").status("app", allocated={"cpu": "2"}).floor(cpu="1"),
            id="counts-from-what-the-kubelet-allocated",
        ),
    ],
)
def test_room_is_what_the_kubelet_stops_counting(expected: Resources, pod: PodBuilder) -> None:
    assert expected == room(pod.build())


def test_a_malformed_floor_is_named_in_the_plan() -> None:
    result = malformed_floor_is_an_ordinary_candidate().plan()

    assert [("default/bad-floor", "annotation resize-preemption.io/floor is not valid JSON")] == [
        (ref.key, error) for ref, error in result.floor_errors
    ]
    scene = malformed_floor_is_an_ordinary_candidate()
    scene.policy = DefaultPolicy(lending=False)
    assert () == scene.plan().floor_errors


def test_borrow_takes_only_what_is_needed_and_never_below_the_floor() -> None:
    pod = lender("a", "3", "4Gi").floor(cpu="1", memory="1Gi").admitted().build()

    loans, freed = borrow(pod, Resources(1500, 0))
    assert Resources(1500, 0) == freed
    assert [("cpu", 3000, 1500)] == [(x.resource, x.before, x.after) for x in loans]

    loans, freed = borrow(pod, Resources(5000, 5 * 2**30))
    assert Resources(2000, 3 * 2**30) == freed
    assert [("cpu", 1000), ("memory", 2**30)] == [(x.resource, x.after) for x in loans]


SHAPES = st.tuples(
    st.integers(200, 4000),  # app cpu, millicores
    st.sampled_from((None, 100, 1500, 5000)),  # second app container
    st.sampled_from((None, "init", "sidecar")),
    st.integers(0, 6000),  # its cpu
    st.sampled_from((None, 0.5, 1.0, 1.5)),  # allocated, as a share of the spec
    st.integers(1, 4000),  # floor
    st.integers(1, 6000),  # wanted
)


@settings(max_examples=300, deadline=None)
@given(SHAPES)
def test_a_loan_is_the_highest_amount_freeing_what_is_wanted(shape: tuple[Any, ...]) -> None:
    # Checked against every amount from the request down to the floor.
    app, second, extra, extra_cpu, allocated, floor, want = shape
    b = make_pod("lender").priority(LOW).requests(cpu=f"{app}m").floor(cpu=f"{floor}m")
    if second is not None:
        b.requests(cpu=f"{second}m", container="second")
    if extra is not None:
        b.init_container("extra", cpu=f"{extra_cpu}m", sidecar=extra == "sidecar")
    if allocated is not None:
        b.admitted().status("app", allocated={"cpu": f"{int(app * allocated)}m"})
    pod = b.build()
    base = held(pod).cpu

    def frees(after: int) -> int:
        return base - held(lowered(pod, "app", "cpu", after)).cpu

    loans, freed = borrow(pod, Resources(want, 0))
    amounts = range(app - 1, floor - 1, -1)  # highest first
    target = min(want, frees(floor)) if floor < app else 0
    best = next((a for a in amounts if frees(a) >= target), None) if target > 0 else None
    assert best == (loans[0].after if loans else None)
    assert (frees(best) if best is not None else 0) == freed.cpu
