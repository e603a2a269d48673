"""The reconciler: deferred resizes planned like admissions, against a static cluster and
the in-memory ledger."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.builders import (
    HIGH,
    LOW,
    MID,
    NODE,
    NOW,
    OTHER_NODE,
    T0,
    PodBuilder,
    make_node,
    make_pdb,
    make_pod,
    uid,
)
from tests.unit.test_worker_logic import LOAN
from tests.unit.test_worker_logic import entry as worker_entry
from tests.unit.test_worker_logic import pod as cached_pod
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.model import NODE_OPT_OUT_ANNOTATION, DisruptionBudget, Node, Pod, PodRef
from webhook.core.plan import Plan
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.states import is_give_back
from webhook.engine.reconciler import DEFERRED_REASONS, Reconciler, review_uid_for, skip_reason

CONFIG = Config(reservation_ttl=120.0)
GI = 2**30


def high() -> PodBuilder:
    """Holds 4 CPUs, asks for 6, and the kubelet deferred it."""
    return (
        make_pod("high")
        .priority(HIGH)
        .requests(cpu="6", memory="1Gi")
        .holding(cpu="4", memory="1Gi")
        .started(50)
        .generation(2)
        .deferred()
    )


def low(name: str, cpu: str = "1", started: float = 100.0, priority: int = LOW) -> PodBuilder:
    return (
        make_pod(name)
        .priority(priority)
        .requests(cpu=cpu, memory="256Mi")
        .labels(app=name)
        .started(started)
        .admitted()
    )


def peer(name: str = "peer", cpu: str = "1") -> PodBuilder:
    """As important as ``high``: never a victim."""
    return low(name, cpu, priority=HIGH)


# The base scene on an 8-CPU node: high 4 (wants 6), low-a 2, low-b 1, peer 1 = 8 used.
# Removing both low pods leaves 4 + 1 + 2 (growth) = 7; low-a (more important, started
# first) does not fit back in, low-b does: the minimal plan is [low-a].
BASE = (low("low-a", "2", started=100), low("low-b", "1", started=200), peer())


def entry_for(
    pod: str,
    *victims: str,
    cpu: int = 6000,
    expires_at: float = NOW + 60,
    review: str = "review-1",
    node: str = NODE,
    handled: tuple[str, ...] = (),
) -> LedgerEntry:
    return LedgerEntry(
        pod=PodRef("default", pod, uid(pod)),
        node=node,
        review_uid=review,
        resources=Resources(cpu, GI),
        desired=(("app", Resources(cpu, GI)),),
        victims=tuple(PodRef("default", v, uid(v)) for v in victims),
        admitted_at=NOW - 1,
        expires_at=expires_at,
        handled=frozenset(uid(h) for h in handled),
        persisted=True,
    )


@dataclass
class Scene:
    pods: tuple[PodBuilder | Pod, ...]
    nodes: tuple[Node, ...] = (make_node(NODE).allocatable(cpu="8", memory="16Gi").build(),)
    budgets: tuple[DisruptionBudget, ...] = ()
    entries: tuple[LedgerEntry, ...] = ()
    config: Config = CONFIG
    synced: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def run(scene: Scene) -> tuple[list[Any], InMemoryLedger, Reconciler]:
    pods = [p.build() if isinstance(p, PodBuilder) else p for p in scene.pods]
    view = StaticClusterView(scene.nodes, pods, scene.budgets, synced=scene.synced)
    ledger = InMemoryLedger()
    for e in scene.entries:
        ledger.update(e.node, lambda es, e=e: ((*es, e), None))
    before = {e.review_uid for e in ledger.all_entries()}
    reconciler = Reconciler(scene.config, view, ledger, metrics=Metrics(), clock=lambda: NOW)
    outcomes = reconciler.reconcile()
    summary = [
        (
            o.pod.split("/")[1],
            o.verdict,
            o.code,
            o.admitted,
            tuple(v.pod.name for v in (o.plan.victims if o.plan else ())),
        )
        for o in outcomes
    ]
    admitted = [e for e in ledger.all_entries() if e.review_uid not in before]
    assert sum(1 for o in outcomes if o.admitted) == len(admitted)
    return summary, ledger, reconciler


CASES = [
    # -- planning for a deferred resize ---------------------------------------------------
    pytest.param(
        Scene((high(), *BASE)),
        [("high", "preempt", "preempt", True, ("low-a",))],
        id="cold-start-deferred-resize-preempts-the-minimal-set",
    ),
    pytest.param(
        Scene((high(), low("low-a", "1"), peer("peer", "1"))),
        [("high", "fits", "fits", False, ())],
        id="room-appeared-fits-no-entry",
    ),
    pytest.param(
        Scene((high(), low("low-a", "2"), peer("peer", "2"))),
        [("high", "preempt", "preempt", True, ("low-a",))],
        id="only-the-lower-priority-pod-can-go",
    ),
    pytest.param(
        Scene((high(), peer("peer-a", "2"), peer("peer-b", "2"))),
        [("high", "infeasible", "insufficient-after-preemption", False, ())],
        id="equal-priority-is-never-a-victim",
    ),
    # -- skips -------------------------------------------------------------------------------
    pytest.param(
        Scene((high().resize_pending("Infeasible"), *BASE)),
        [],
        id="infeasible-resize-skipped",
    ),
    pytest.param(
        Scene((high().resize_preemption_disabled(), *BASE)),
        [],
        id="pod-condition-preemption-disabled-skipped",
    ),
    pytest.param(
        Scene(
            (high(), *BASE),
            nodes=(
                make_node(NODE)
                .allocatable(cpu="8", memory="16Gi")
                .annotate(NODE_OPT_OUT_ANNOTATION, "true")
                .build(),
            ),
        ),
        [("high", "not-eligible", "node-opted-out", False, ())],
        id="node-opted-out-by-annotation",
    ),
    pytest.param(
        Scene(
            (high(), *BASE),
            nodes=(make_node(NODE).allocatable(cpu="8", memory="16Gi").opted_out().build(),),
        ),
        [("high", "not-eligible", "node-opted-out", False, ())],
        id="node-opted-out-by-field",
    ),
    pytest.param(
        Scene((high().never_preempts(), *BASE)),
        [("high", "not-eligible", "preemption-policy-never", False, ())],
        id="preemption-policy-never",
    ),
    pytest.param(
        Scene(
            (
                make_pod("high")
                .priority(HIGH)
                .requests(cpu="6", memory="1Gi")
                .holding(cpu="4", memory="1Gi"),
                *BASE,
            )
        ),
        [],
        id="no-pending-condition-not-looked-at",
    ),
    pytest.param(
        Scene((high().terminating(), *BASE)),
        [],
        id="terminating-resizing-pod-skipped",
    ),
    pytest.param(
        Scene((high().on(OTHER_NODE), *BASE)),
        [],
        id="node-not-in-cache-skipped",
    ),
    pytest.param(
        Scene((high(), *BASE), synced=False),
        [],
        id="unsynced-cache-plans-nothing",
    ),
    # -- the ledger ------------------------------------------------------------------------
    pytest.param(
        Scene((high(), *BASE), entries=(entry_for("high", "low-a"),)),
        [],
        id="live-entry-owned-by-the-worker",
    ),
    pytest.param(
        Scene((high(), *BASE), entries=(entry_for("high", "low-a", expires_at=NOW),)),
        [("high", "preempt", "preempt", True, ("low-a",))],
        id="expired-entry-planned-again",
    ),
    pytest.param(
        # Another pod's admitted resize claimed low-a and holds 1 CPU more for itself.
        Scene(
            (high(), *BASE, low("low-c", "1", started=300)),
            nodes=(make_node(NODE).allocatable(cpu="9", memory="16Gi").build(),),
            entries=(entry_for("peer", "low-a", cpu=2000, review="other"),),
        ),
        [("high", "preempt", "preempt", True, ("low-c",))],
        id="victims-claimed-by-another-entry-are-not-chosen-again",
    ),
    # -- capacity already on its way out ---------------------------------------------------
    pytest.param(
        Scene((high(), low("low-a", "2").terminating(), low("low-b", "1"), peer())),
        [("high", "fits", "fits-once-terminated", False, ())],
        id="terminating-pod-frees-all-the-room-no-victims",
    ),
    pytest.param(
        Scene(
            (
                high(),
                low("leaving", "1").terminating(),
                low("low-a", "1", started=100),
                low("low-b", "1", started=200),
                peer("peer", "1"),
            )
        ),
        [("high", "preempt", "preempt", True, ("low-b",))],
        id="terminating-pod-frees-part-only-the-rest-preempted",
    ),
    pytest.param(
        Scene(
            (high(), low("low-a", "2"), low("low-b", "1"), peer()),
            entries=(entry_for("other", "low-a", cpu=0, review="other", handled=()),),
        ),
        [("high", "fits", "fits-once-terminated", False, ())],
        id="victim-claimed-by-another-entry-counts-as-freeing",
    ),
    # -- disruption budgets -----------------------------------------------------------------
    pytest.param(
        Scene((high(), *BASE), budgets=(make_pdb("low-a").allowing(0).build(),)),
        [("high", "infeasible", "pdb-violation", False, ())],
        id="budget-forbids-the-only-useful-victim",
    ),
    pytest.param(
        Scene((high(), *BASE), budgets=(make_pdb("low-a").allowing(1).build(),)),
        [("high", "preempt", "preempt", True, ("low-a",))],
        id="budget-allows-it",
    ),
    pytest.param(
        Scene(
            (high(), *BASE),
            budgets=(make_pdb("low-a").allowing(0).build(),),
            config=Config(pdb_mode="best-effort"),
        ),
        [("high", "preempt", "preempt", True, ("low-a",))],
        id="best-effort-takes-a-protected-victim-the-eviction-api-may-refuse",
    ),
    # -- several deferred pods: the kubelet's order ----------------------------------------
    pytest.param(
        Scene(
            (
                high(),
                make_pod("mid")
                .priority(MID)
                .requests(cpu="2", memory="256Mi")
                .holding(cpu="1", memory="256Mi")
                .started(60)
                .deferred(since=100),
                low("low-a", "1", started=100),
                low("low-b", "1", started=200),
                peer("peer", "1"),
            )
        ),
        [
            ("high", "preempt", "preempt", True, ("low-b", "low-a")),
            ("mid", "infeasible", "insufficient-after-preemption", False, ()),
        ],
        id="higher-priority-first-the-next-plans-against-its-reservation",
    ),
]


@pytest.mark.parametrize(("scene", "expected"), CASES)
def test_reconcile(scene: Scene, expected: list[tuple[Any, ...]]) -> None:
    summary, ledger, _ = run(scene)

    assert summary == expected
    admitted = {s[0]: s[4] for s in summary if s[3]}
    mine = [e for e in ledger.all_entries() if e.review_uid.startswith("deferred/")]
    assert {e.pod.name: tuple(v.name for v in e.victims) for e in mine} == admitted
    for e in mine:
        assert e.persisted
        assert e.expires_at == NOW + scene.config.reservation_ttl
        assert e.admitted_at == NOW
    # Entries of other pods are kept; expired ones may be dropped with the write.
    others = {e.review_uid for e in scene.entries if e.expires_at > NOW}
    assert others <= {e.review_uid for e in ledger.all_entries()}


def test_the_entry_is_the_admission_paths_shape() -> None:
    _, ledger, _ = run(Scene((high(), *BASE)))
    [e] = ledger.all_entries()
    pod = high().build()
    assert e.review_uid == review_uid_for(pod) == f"deferred/{pod.uid}/2"
    assert e.pod == pod.ref and e.node == NODE
    assert e.resources == Resources(6000, GI)
    assert e.desired == (("app", Resources(6000, GI)),)


def test_a_second_pass_adds_nothing_and_counts_once() -> None:
    pods = [p.build() for p in (high(), *BASE)]
    view = StaticClusterView([make_node(NODE).build()], pods)
    ledger = InMemoryLedger()
    metrics = Metrics()
    reconciler = Reconciler(CONFIG, view, ledger, metrics=metrics, clock=lambda: NOW)

    first = reconciler.reconcile()
    writes = ledger.writes
    second = reconciler.reconcile()

    assert [o.admitted for o in first] == [True] and second == []
    assert ledger.writes == writes
    sample = metrics.registry.get_sample_value
    assert sample("resize_preemption_reconciler_actions_total", {"verdict": "preempt"}) == 1
    assert sample("resize_preemption_planned_victims_total") == 1


def test_started_it_plans_at_once_and_again_when_woken() -> None:
    pods = [p.build() for p in (high(), *BASE)]
    view = StaticClusterView([make_node(NODE).build()], pods)
    ledger = InMemoryLedger()
    reconciler = Reconciler(CONFIG, view, ledger, clock=lambda: NOW)

    def admitted() -> bool:
        deadline = time.monotonic() + 5
        while not ledger.all_entries():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    reconciler.start()
    try:
        assert admitted()  # the cold start's pass
        ledger.update(NODE, lambda entries: ((), None))  # the entry went away
        reconciler.wake()
        assert admitted()
    finally:
        reconciler.stop(5)
    assert 1 == len(ledger.all_entries())


def test_a_pod_left_pending_is_counted_on_changes_only_and_told_only_when_planned() -> None:
    """A pod the reconciler cannot help gets no event (its resize was answered with a
    kubectl warning when it was made); the metric still follows its decision."""
    pods = [p.build() for p in (high(), *BASE)]
    node = make_node(NODE).build()
    decisions: list[tuple[str, str, bool]] = []
    metrics = Metrics()
    reconciler = Reconciler(
        CONFIG,
        StaticClusterView([node], pods, [make_pdb("low-a").allowing(0).build()]),
        InMemoryLedger(),
        metrics=metrics,
        clock=lambda: NOW,
        on_decision=lambda p, plan, ok: decisions.append((p.name, plan.code, ok)),
    )
    for _ in range(3):
        reconciler.reconcile()
    assert [] == decisions
    assert 1 == metrics.registry.get_sample_value(
        "resize_preemption_reconciler_actions_total", {"verdict": "infeasible"}
    )

    # The budget's status changed (the cache wakes the reconciler): planned on that pass.
    reconciler.cluster = StaticClusterView([node], pods, [make_pdb("low-a").allowing(1).build()])
    reconciler.reconcile()

    assert [("high", "preempt", True)] == decisions
    sample = metrics.registry.get_sample_value
    assert sample("resize_preemption_reconciler_actions_total", {"verdict": "infeasible"}) == 1
    assert sample("resize_preemption_reconciler_actions_total", {"verdict": "preempt"}) == 1


def test_a_racing_admission_wins_and_the_pass_records_nothing() -> None:
    """The pre-check saw no entry, but one appeared before the atomic update."""
    pods = [p.build() for p in (high(), *BASE)]
    view = StaticClusterView([make_node(NODE).build()], pods)

    class Racing(InMemoryLedger):
        def update(self, node: str, change: Any) -> Any:
            if not self.entries(node):
                super().update(node, lambda es: ((*es, entry_for("high", "low-b")), None))
            return super().update(node, change)

    ledger = Racing()
    outcomes = Reconciler(CONFIG, view, ledger, clock=lambda: NOW).reconcile()

    assert outcomes == []
    assert [e.review_uid for e in ledger.all_entries()] == ["review-1"]


def test_a_failing_hook_does_not_stop_the_pass() -> None:
    pods = [p.build() for p in (high(), *BASE)]
    view = StaticClusterView([make_node(NODE).build()], pods)

    def boom(pod: Pod, plan: Plan, admitted: bool) -> None:
        raise RuntimeError("event sink down")

    ledger = InMemoryLedger()
    outcomes = Reconciler(CONFIG, view, ledger, clock=lambda: NOW, on_decision=boom).reconcile()
    assert [o.admitted for o in outcomes] == [True]
    assert len(ledger.all_entries()) == 1


@pytest.mark.parametrize(
    ("builder", "reason"),
    [
        pytest.param(high(), "", id="deferred"),
        pytest.param(high().resize_pending("Infeasible"), "infeasible", id="infeasible"),
        pytest.param(high().resize_preemption_disabled(), "preemption-disabled", id="disabled"),
        pytest.param(high().terminating(), "leaving", id="terminating"),
        pytest.param(high().phase("Failed"), "leaving", id="terminal"),
        pytest.param(high().unbound(), "not-bound", id="unbound"),
        pytest.param(make_pod("x").requests(cpu="1"), "not-pending", id="nothing-pending"),
    ],
)
def test_skip_reason(builder: PodBuilder, reason: str) -> None:
    assert skip_reason(builder.build()) == reason


def test_a_deferred_give_back_is_told_apart_from_a_deferred_resize() -> None:
    entries = (replace(worker_entry(), loans=(LOAN,)),)

    assert is_give_back(cached_pod("lender", cpu="3", allocated="1", resize="Deferred"), entries)
    # Its owner asked for another amount: an ordinary deferred resize.
    assert not is_give_back(
        cached_pod("lender", cpu="4", allocated="1", resize="Deferred"), entries
    )
    assert not is_give_back(cached_pod("lender", cpu="3", allocated="1", resize="Deferred"), ())


def deferred_gauges(metrics: Metrics) -> dict[str, tuple[float, float]]:
    """reason -> (pods, longest wait) for every reason with pods."""
    sample = metrics.registry.get_sample_value
    gauges = {
        reason: (
            sample("resize_preemption_deferred_resizes", {"reason": reason}),
            sample("resize_preemption_deferred_resizes_longest_wait_seconds", {"reason": reason}),
        )
        for reason in DEFERRED_REASONS
    }
    assert all(v is not None for pair in gauges.values() for v in pair), "every reason is set"
    return {r: (float(n or 0), float(w or 0)) for r, (n, w) in gauges.items() if n}


#: high() has waited since T0 + 500: NOW - 500 - T0 seconds.
WAITED = NOW - T0 - 500


@pytest.mark.parametrize(
    ("expected", "pods", "budgets"),
    [
        pytest.param({"preempt": (1.0, WAITED)}, (high(), *BASE), (), id="preemption-helps"),
        pytest.param(
            {"infeasible": (1.0, WAITED)},
            (high(), *BASE),
            (make_pdb("low-a").allowing(0).build(),),
            id="a-budget-keeps-the-victim",
        ),
        pytest.param({"fits": (1.0, WAITED)}, (high(), low("low-a", "1")), (), id="room-appeared"),
        pytest.param(
            {"preemption-disabled": (1.0, WAITED)},
            (high().resize_preemption_disabled(), *BASE),
            (),
            id="opted-out-pod",
        ),
        pytest.param(
            {"preempt": (1.0, WAITED), "fits": (2.0, NOW - T0 - 300)},
            (
                high(),
                make_pod("high-2").on(OTHER_NODE).priority(HIGH).requests(cpu="1").deferred(300),
                make_pod("high-3").on(OTHER_NODE).priority(HIGH).requests(cpu="1").deferred(900),
                *BASE,
            ),
            (),
            id="one-gauge-per-reason",
        ),
        pytest.param(
            {},
            (make_pod("big").priority(HIGH).requests(cpu="1").resize_pending("Infeasible"),),
            (),
            id="infeasible-by-the-kubelet-is-not-deferred",
        ),
    ],
)
def test_deferred_resizes_are_counted_by_why_they_wait(
    expected: dict[str, tuple[float, float]],
    pods: tuple[PodBuilder, ...],
    budgets: tuple[DisruptionBudget, ...],
) -> None:
    nodes = [make_node(NODE).build(), make_node(OTHER_NODE).build()]
    metrics = Metrics()
    view = StaticClusterView(nodes, [p.build() for p in pods], budgets)
    reconciler = Reconciler(CONFIG, view, InMemoryLedger(), metrics=metrics, clock=lambda: NOW)

    reconciler.reconcile()
    reconciler.reconcile()  # an admitted plan is the worker's now: still waiting on preemption

    assert expected == deferred_gauges(metrics)


def test_a_stopped_reconciler_counts_no_deferred_resizes() -> None:
    metrics = Metrics()
    view = StaticClusterView([make_node(NODE).build()], [p.build() for p in (high(), *BASE)])
    reconciler = Reconciler(CONFIG, view, InMemoryLedger(), metrics=metrics, clock=lambda: NOW)
    reconciler.reconcile()

    reconciler.stop(5)

    assert {} == deferred_gauges(metrics)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["Deferred", "Infeasible"]),
            st.sampled_from(["plain", "disabled", "terminating", "unbound", "elsewhere"]),
            st.integers(min_value=1, max_value=12),
            st.integers(min_value=0, max_value=9000),
        ),
        max_size=8,
    )
)
def test_every_deferred_pod_is_counted_under_exactly_one_reason(
    pods: list[tuple[str, str, int, int]],
) -> None:
    built = []
    for i, (pending, kind, cpu, since) in enumerate(pods):
        b = make_pod(f"p{i}").priority(HIGH).requests(cpu=str(cpu)).resize_pending(pending, since)
        b = {
            "plain": b,
            "disabled": b.resize_preemption_disabled(),
            "terminating": b.terminating(),
            "unbound": b.unbound(),
            "elsewhere": b.on("gone-node"),
        }[kind]
        built.append(b.build())
    metrics = Metrics()
    view = StaticClusterView([make_node(NODE).build()], [*built, *(p.build() for p in BASE)])
    reconciler = Reconciler(CONFIG, view, InMemoryLedger(), metrics=metrics, clock=lambda: NOW)

    reconciler.reconcile()

    gauges = deferred_gauges(metrics)
    deferred = [p for p in built if p.resize == "deferred"]
    assert len(deferred) == sum(n for n, _ in gauges.values())
    for _, longest in gauges.values():
        assert 0 <= longest <= NOW - T0
