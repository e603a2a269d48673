"""The preemption worker's loop over a fake cluster, an in-memory ledger and a fake evictor."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from harness.doubles import FakeEvents, FakeEvictor, FakeResizer, InMemoryLedger, StaticClusterView
from tests.unit.test_worker_logic import (
    ADMITTED,
    HIGH_5,
    HIGH_BEFORE,
    HIGH_RESIZED,
    LOW,
    LOW_A,
    LOW_B,
    MID,
    NODE,
    NOW,
    entry,
    pod,
    ref,
)
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.model import Node, Pod, PodRef
from webhook.engine.ledger import EvictionResult, LedgerEntry
from webhook.engine.lifecycle.changes import drop_victims, release
from webhook.engine.lifecycle.states import room_holders
from webhook.engine.loans import LenderResizer
from webhook.engine.worker import PreemptionWorker

CONFIG = Config(persist_timeout=10.0, reservation_ttl=120.0)


class Clock:
    def __init__(self, now: float = ADMITTED + 1.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Cluster:
    """A ClusterView whose contents a test can replace."""

    def __init__(self, *pods: Pod, synced: bool = True) -> None:
        self.set(*pods, synced=synced)

    def set(self, *pods: Pod, synced: bool = True) -> None:
        self.view = StaticClusterView([NODE], pods, synced=synced)

    def __getattr__(self, name: str) -> object:
        return getattr(self.view, name)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def evictor() -> FakeEvictor:
    return FakeEvictor()


@pytest.fixture
def recorder() -> FakeEvents:
    return FakeEvents()


@pytest.fixture
def ledger() -> InMemoryLedger:
    return InMemoryLedger()


def make_worker(
    cluster: Cluster,
    ledger: InMemoryLedger,
    evictor: FakeEvictor,
    clock: Clock,
    recorder: FakeEvents | None = None,
    metrics: Metrics | None = None,
    resizer: LenderResizer | None = None,
) -> PreemptionWorker:
    # The doubles act on the world the worker reads, unless a test gave them another.
    for double in (evictor, resizer):
        if isinstance(double, FakeEvictor | FakeResizer) and double.view is None:
            double.view = cluster  # type: ignore[assignment]
    return PreemptionWorker(
        cluster,  # type: ignore[arg-type]
        ledger,
        evictor,
        CONFIG,
        metrics or Metrics(),
        clock,
        recorder=recorder,  # type: ignore[arg-type]
        interval=0.01,
        rng=lambda: 1.0,
        resizer=resizer,
    )


def add(ledger: InMemoryLedger, *entries: LedgerEntry) -> None:
    for e in entries:
        ledger.update(e.node, lambda es, e=e: ((*es, e), None))


def only(ledger: InMemoryLedger) -> LedgerEntry:
    [e] = ledger.all_entries()
    return e


def test_evicts_the_victim_once_and_writes_nothing(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock, recorder: FakeEvents
) -> None:
    add(ledger, entry("low"))
    written_before = ledger.writes
    worker = make_worker(Cluster(HIGH_RESIZED, LOW, MID), ledger, evictor, clock, recorder)

    worker.run_once()
    worker.run_once()  # the cache still shows "low" running: never evicted again

    assert [("low", "high", "node-1")] == evictor.calls
    assert 0 == ledger.writes - written_before
    # The plan was told by the kubectl warning; the victim's Preempted event is the
    # evictor's. Nothing more on the resizing pod.
    assert [] == recorder.events


def test_an_actuated_resize_is_released_without_a_write(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low", persisted=True))
    written_before = ledger.writes
    actuated = pod("high", cpu="6", priority=1000)
    worker = make_worker(Cluster(actuated, MID), ledger, evictor, clock)

    worker.run_once()

    assert [] == evictor.calls
    assert 0 == ledger.writes - written_before
    # Left for the next write to drop; no reader counts it any more.
    assert () == room_holders(ledger.all_entries(), (actuated, MID), clock.now)


def test_a_plan_given_up_on_tells_the_resizing_pod_once(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock, recorder: FakeEvents
) -> None:
    add(ledger, entry("low", persisted=True))
    evictor.results["low"] = EvictionResult.BLOCKED_BY_PDB
    worker = make_worker(Cluster(HIGH_RESIZED, LOW, MID), ledger, evictor, clock, recorder)
    worker.run_once()
    assert [] == recorder.events

    clock.now = ADMITTED + CONFIG.reservation_ttl
    worker.run_once()
    worker.run_once()

    assert [("high", ("low",), "node-1")] == recorder.events
    assert 1 == len(evictor.calls)


def test_not_persisted_waits_then_releases_evicting_nobody(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low"))
    worker = make_worker(Cluster(HIGH_BEFORE, LOW, MID), ledger, evictor, clock)

    worker.run_once()
    assert len(ledger.all_entries()) == 1

    clock.now = ADMITTED + CONFIG.persist_timeout
    worker.run_once()

    assert ledger.all_entries() == ()
    assert evictor.calls == []


def test_blocked_by_pdb_keeps_the_victim_pending_and_backs_off(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low-a", "low-b", persisted=True))
    evictor.results["low-a"] = EvictionResult.BLOCKED_BY_PDB
    worker = make_worker(Cluster(HIGH_RESIZED, LOW_A, LOW_B, MID), ledger, evictor, clock)

    worker.run_once()
    # Evicted together: the blocked one does not hold back the other.
    assert ["low-a", "low-b"] == sorted(c[0] for c in evictor.calls)
    assert only(ledger).pending_victims == (LOW_A.ref, LOW_B.ref)

    worker.run_once()  # backing off: no call
    assert 2 == len(evictor.calls)

    clock.now += worker.backoff.policy.initial
    evictor.results.clear()
    worker.run_once()
    assert ["low-a"] == [c[0] for c in evictor.calls[2:]]  # low-b was evicted already
    worker.run_once()  # both evicted, the cache a watch delay behind: no call again
    assert 3 == len(evictor.calls)


def test_a_budget_change_ends_the_backoff(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low", persisted=True))
    evictor.results["low"] = EvictionResult.BLOCKED_BY_PDB
    worker = make_worker(Cluster(HIGH_RESIZED, LOW, MID), ledger, evictor, clock)
    worker.run_once()
    worker.wake()  # some other change
    worker.run_once()
    assert len(evictor.calls) == 1  # still backing off

    evictor.results.clear()
    worker.wake(budgets_changed=True)  # e.g. disruptionsAllowed went up
    worker.run_once()

    assert len(evictor.calls) == 2


def test_a_superseded_entry_stops_between_victims_waiting_their_turn(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    first = entry("low-a", "low-b", persisted=True)
    add(ledger, first)
    worker = make_worker(Cluster(HIGH_RESIZED, LOW_A, LOW_B, MID), ledger, evictor, clock)
    worker.victim_parallelism = 1  # low-b waits for a turn

    def newer_resize(_: PodRef) -> None:
        # A newer admission of the same pod replaced the entry meanwhile.
        ledger.update("node-1", release(first.review_uid, (), NOW))

    evictor.on_evict = newer_resize
    worker.run_once()

    assert evictor.calls == [("low-a", "high", "node-1")]


def test_victims_found_leaving_in_the_cache_are_settled_without_a_call(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low", persisted=True))
    metrics = Metrics()
    cluster = Cluster(HIGH_RESIZED, replace(LOW, terminating=True), MID)
    worker = make_worker(cluster, ledger, evictor, clock, metrics=metrics)

    written_before = ledger.writes

    worker.run_once()
    worker.run_once()

    assert evictor.calls == []
    assert 0 == ledger.writes - written_before
    sample = metrics.registry.get_sample_value
    assert sample("resize_preemption_victims_total", {"result": "skipped-terminating"}) == 1


def test_nothing_happens_before_the_cache_synced(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low"))
    worker = make_worker(Cluster(synced=False), ledger, evictor, clock)

    worker.run_once()

    assert len(ledger.all_entries()) == 1  # an empty cache does not mean the pod is gone


def test_errors_are_counted_and_the_entry_retried(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low"))
    metrics = Metrics()
    worker = make_worker(Cluster(HIGH_RESIZED, LOW, MID), ledger, evictor, clock, metrics=metrics)

    def boom(_: PodRef) -> None:
        raise RuntimeError("boom")

    evictor.on_evict = boom
    worker.run_once()
    assert (
        metrics.registry.get_sample_value("resize_preemption_errors_total", {"where": "worker"})
        == 1
    )

    evictor.on_evict = None
    clock.now += worker.backoff.policy.cap
    worker.run_once()
    worker.run_once()
    assert ["low", "low"] == [c[0] for c in evictor.calls]


def test_entries_run_in_admitted_order_and_claims_prevent_extra_evictions(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 CPUs: filler 2 + low-a 2 + low-b 2 + g1 1 + g2 1. Each of g1, g2 grows by 1 and
    # was admitted with one victim; one eviction makes room for both.
    g1 = pod("g1", cpu="2", allocated="1", priority=1000)
    g2 = pod("g2", cpu="2", allocated="1", priority=1000)
    filler = pod("filler", cpu="2", priority=2000)
    first = replace(
        entry("low-a", pod_name="g1", review="r1", desired_cpu=2000, persisted=True),
        admitted_at=ADMITTED,
    )
    second = replace(
        entry("low-b", pod_name="g2", review="r2", desired_cpu=2000, persisted=True),
        admitted_at=ADMITTED + 0.5,
    )
    add(ledger, second, first)
    worker = make_worker(Cluster(g1, g2, filler, LOW_A, LOW_B), ledger, evictor, clock)
    order: list[str] = []
    process = worker.process

    def spy(e: LedgerEntry, stop: threading.Event | None = None) -> object:
        order.append(e.review_uid)
        return process(e, stop)

    monkeypatch.setattr(worker, "process", spy)
    worker.run_once()

    assert order == ["r1", "r2"]
    # g1 goes first and sees g2's claim on low-b freeing the room it needs too: it lets
    # low-a go from its claim; g2 then still needs its own victim. One eviction in all.
    assert [c[0] for c in evictor.calls] == ["low-b"]
    by_review = {e.review_uid: e for e in ledger.all_entries()}
    assert by_review["r1"].victims == ()
    assert (LOW_B.ref,) == by_review["r2"].victims


def test_the_thread_wakes_works_and_stops(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    worker = make_worker(Cluster(HIGH_RESIZED, LOW, MID), ledger, evictor, clock)
    worker.start()
    try:
        add(ledger, entry("low"))
        worker.wake()
        assert evictor.called.wait(5)
    finally:
        worker.stop(timeout=5)
    assert not worker.running
    assert [("low", "high", "node-1")] == evictor.calls


def test_a_plan_carried_out_costs_no_ledger_write_before_or_after_the_eviction(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low"))  # as admitted
    written_before = ledger.writes
    at_eviction: list[int] = []
    evictor.on_evict = lambda _: at_eviction.append(ledger.writes - written_before)
    worker = make_worker(Cluster(HIGH_RESIZED, LOW, MID), ledger, evictor, clock)

    worker.run_once()
    worker.run_once()

    assert [0] == at_eviction
    assert 0 == ledger.writes - written_before
    # The worker had just seen the victim live in its cache, and says so.
    assert [True] == evictor.seen_live


def test_a_refused_eviction_writes_nothing(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    add(ledger, entry("low"))
    written_before = ledger.writes
    evictor.results["low"] = EvictionResult.BLOCKED_BY_PDB
    worker = make_worker(Cluster(HIGH_RESIZED, LOW, MID), ledger, evictor, clock)

    worker.run_once()

    assert 0 == ledger.writes - written_before


def test_victims_no_longer_needed_leave_the_claim_before_anyone_is_evicted(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    # "high" grows by 3 and was admitted with two 2-CPU victims, but 1 CPU is free now:
    # low-b alone makes room, and low-a must stop counting as freeing before it goes.
    add(ledger, entry("low-b", "low-a", desired_cpu=5000, persisted=True))
    claimed_at_eviction: list[tuple[str, ...]] = []
    evictor.on_evict = lambda _: claimed_at_eviction.append(
        tuple(v.name for v in only(ledger).victims)
    )
    worker = make_worker(Cluster(HIGH_5, LOW_A, LOW_B, MID), ledger, evictor, clock)

    worker.run_once()

    assert [("low-b",)] == claimed_at_eviction
    assert [("low-b", "high", "node-1")] == evictor.calls


NODE_2 = Node(name="node-2", allocatable=NODE.allocatable)
#: The walkthrough again on node-2, and its admitted plan.
ON_TWO = (
    pod("high-2", cpu="6", allocated="2", priority=1000, node="node-2"),
    pod("low-2", cpu="4", node="node-2"),
    pod("mid-2", cpu="1", priority=2000, node="node-2"),
)
SECOND = replace(
    entry("low-2", pod_name="high-2", review="review-2"), node="node-2", victims=(ref("low-2"),)
)


def test_nodes_are_worked_on_side_by_side(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    # Two walkthroughs on two nodes: each eviction waits until the other one started,
    # which only works when the two nodes are worked on at the same time.
    view = StaticClusterView([NODE, NODE_2], (HIGH_RESIZED, LOW, MID, *ON_TWO))
    add(ledger, entry("low"), SECOND)
    together = threading.Barrier(2, timeout=5)
    evictor.on_evict = lambda _: together.wait()
    metrics = Metrics()
    worker = make_worker(Cluster(), ledger, evictor, clock, metrics=metrics)
    worker.cluster = view

    worker.run_once()

    assert {("low", "high", "node-1"), ("low-2", "high-2", "node-2")} == set(evictor.calls)
    assert not together.broken
    assert None is metrics.registry.get_sample_value(
        "resize_preemption_errors_total", {"where": "worker"}
    )
    worker.stop()


def test_a_node_admitted_during_a_pass_is_taken_up_before_the_pass_ends(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    # node-1's eviction hangs until node-2's has happened: node-2's entry, written while
    # node-1 is being worked on, must not wait for the pass to end.
    add(ledger, entry("low"))
    first_started, second_evicted = threading.Event(), threading.Event()

    def on_evict(victim: PodRef) -> None:
        if victim.name == "low":
            first_started.set()
            second_evicted.wait(5)
        else:
            second_evicted.set()

    evictor.on_evict = on_evict
    worker = make_worker(Cluster(), ledger, evictor, clock)
    worker.cluster = StaticClusterView([NODE, NODE_2], (HIGH_RESIZED, LOW, MID, *ON_TWO))
    passing = threading.Thread(target=worker.run_once)
    passing.start()
    assert first_started.wait(5)
    add(ledger, SECOND)
    worker.wake()

    assert second_evicted.wait(2)
    passing.join(5)
    assert [("low", "high", "node-1"), ("low-2", "high-2", "node-2")] == evictor.calls
    worker.stop()


@pytest.mark.parametrize("nodes", [1, 2], ids=["one-plan", "two-plans"])
def test_each_plan_evicts_at_most_victim_parallelism_at_once(
    nodes: int, ledger: InMemoryLedger, clock: Clock
) -> None:
    # Three victims per plan, two at once at most for each plan: with two plans on two
    # nodes, four evictions run together.
    cluster: list[Pod] = []
    for n in range(1, nodes + 1):
        node = f"node-{n}"
        lows = tuple(
            pod(f"low-{n}{i}", cpu="1", start=f"2024-01-01T0{i}:00:00Z", node=node)
            for i in range(3)
        )
        cluster += [
            pod(f"high-{n}", cpu="5", allocated="2", priority=1000, resize="Deferred", node=node),
            pod(f"mid-{n}", cpu="3", priority=2000, node=node),
            *lows,
        ]
        names = (p.name for p in lows)
        plan = entry(*names, desired_cpu=5000, persisted=True, pod_name=f"high-{n}", review=node)
        add(ledger, replace(plan, node=node))
    lock = threading.Lock()
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    total, top = [0], [0]
    all_started = threading.Event()

    class CountingEvictor(FakeEvictor):
        def evict(
            self, victim: PodRef, preemptor: PodRef, node: str, *, seen_live: bool = False
        ) -> EvictionResult:
            with lock:
                running[node] = running.get(node, 0) + 1
                most[node] = max(most.get(node, 0), running[node])
                total[0] += 1
                top[0] = max(top[0], total[0])
                if total[0] == 2 * nodes:
                    all_started.set()
            all_started.wait(2)
            with lock:
                running[node] -= 1
                total[0] -= 1
            return super().evict(victim, preemptor, node, seen_live=seen_live)

    evictor = CountingEvictor()
    worker = make_worker(Cluster(), ledger, evictor, clock)
    worker.cluster = StaticClusterView(
        [Node(name=f"node-{n}", allocatable=NODE.allocatable) for n in range(1, nodes + 1)],
        tuple(cluster),
    )
    worker.victim_parallelism = 2

    worker.run_once()

    assert 3 * nodes == len(evictor.calls)
    assert {f"node-{n}": 2 for n in range(1, nodes + 1)} == most
    assert 2 * nodes == top[0]
    worker.stop()


def test_a_plans_victims_are_evicted_together(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    # Each eviction waits until the other one started: only victims evicted side by side
    # get past the barrier.
    add(ledger, entry("low-a", "low-b", persisted=True))
    together = threading.Barrier(2, timeout=5)
    evictor.on_evict = lambda _: together.wait()
    worker = make_worker(Cluster(HIGH_RESIZED, LOW_A, LOW_B, MID), ledger, evictor, clock)

    worker.run_once()

    assert ["low-a", "low-b"] == sorted(c[0] for c in evictor.calls)
    assert not together.broken
    assert worker.backoff.ready(only(ledger).review_uid)
    worker.run_once()  # the cache a watch delay behind: never evicted again
    assert 2 == len(evictor.calls)
    worker.stop()


@pytest.mark.parametrize("parallelism", [1, 2, 16], ids=["one-at-a-time", "two", "default"])
def test_at_most_victim_parallelism_evictions_run_at_once(
    parallelism: int, ledger: InMemoryLedger, clock: Clock
) -> None:
    lows = tuple(pod(f"low-{i}", cpu="1", start=f"2024-01-01T0{i}:00:00Z") for i in range(4))
    high = pod("high", cpu="6", allocated="2", priority=1000, resize="Deferred")
    mid = pod("mid", cpu="2", priority=2000)
    add(ledger, entry(*(p.name for p in lows), desired_cpu=6000, persisted=True))
    lock, running, most = threading.Lock(), [0], [0]

    class CountingEvictor(FakeEvictor):
        def evict(
            self, victim: PodRef, preemptor: PodRef, node: str, *, seen_live: bool = False
        ) -> EvictionResult:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            threading.Event().wait(0.05)
            with lock:
                running[0] -= 1
            return super().evict(victim, preemptor, node, seen_live=seen_live)

    evictor = CountingEvictor()
    worker = make_worker(Cluster(high, mid, *lows), ledger, evictor, clock)
    worker.victim_parallelism = parallelism

    worker.run_once()

    assert sorted(p.name for p in lows) == sorted(c[0] for c in evictor.calls)
    assert min(2, parallelism) <= most[0] <= min(parallelism, len(lows))
    worker.stop()


@pytest.mark.parametrize(
    "now_pods",
    [
        pytest.param((HIGH_BEFORE, LOW_A, LOW_B, MID), id="patched-back-down"),
        pytest.param((LOW_A, LOW_B, MID), id="resizing-pod-deleted"),
        pytest.param(
            (replace(HIGH_RESIZED, uid="uid-high-2"), LOW_A, LOW_B, MID), id="replaced-by-name"
        ),
    ],
)
def test_a_cancelled_resize_stops_the_rest_of_its_batch(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock, now_pods: tuple[Pod, ...]
) -> None:
    add(ledger, entry("low-a", "low-b", persisted=True))
    cluster = Cluster(HIGH_RESIZED, LOW_A, LOW_B, MID)
    worker = make_worker(cluster, ledger, evictor, clock)
    worker.victim_parallelism = 1  # low-b waits for its turn

    evictor.on_evict = lambda _victim: cluster.set(*now_pods)
    worker.run_once()

    assert [("low-a", "high", "node-1")] == evictor.calls


def test_ledger_changes_are_pure_and_report_presence() -> None:
    e = entry("low-a", "low-b")
    change = drop_victims(e.review_uid, ("uid-low-b",), (), NOW)
    first = change((e,))
    assert first == change((e,))
    new, found = first
    assert found and new is not None
    assert (LOW_A.ref,) == new[0].victims
    assert (None, True) == drop_victims(e.review_uid, ("uid-nobody",), (), NOW)((e,))
    assert (None, False) == drop_victims("other", ("uid-low-a",), (), NOW)((e,))
    assert ((), True) == release(e.review_uid, (), NOW)((e,))
    assert (None, False) == release("other", (), NOW)((e,))


def actuation_times(metrics: Metrics) -> tuple[float | None, float | None]:
    """(count, sum) of ``resize_preemption_actuation_duration_seconds``."""
    name = "resize_preemption_actuation_duration_seconds"
    return (
        metrics.registry.get_sample_value(f"{name}_count"),
        metrics.registry.get_sample_value(f"{name}_sum"),
    )


def test_admission_to_actuation_is_timed_once_when_the_reservation_is_spent(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    metrics = Metrics()
    add(ledger, entry("low", persisted=True))
    cluster = Cluster(HIGH_RESIZED, LOW, MID)
    worker = make_worker(cluster, ledger, evictor, clock, metrics=metrics)
    worker.run_once()  # evicts "low": waiting
    cluster.set(pod("high", cpu="6", priority=1000), MID)
    clock.now = ADMITTED + 7.0

    worker.run_once()
    worker.run_once()

    assert (1.0, 7.0) == actuation_times(metrics)


def test_an_entry_found_spent_by_a_new_leader_is_not_timed(
    ledger: InMemoryLedger, evictor: FakeEvictor, clock: Clock
) -> None:
    # Admitted before this worker ran, actuated before it looked: when is not known.
    metrics = Metrics()
    add(ledger, entry("low", persisted=True))
    worker = make_worker(Cluster(pod("high", cpu="6", priority=1000), MID), ledger, evictor, clock)
    worker.metrics = metrics

    worker.run_once()

    assert (0.0, 0.0) == actuation_times(metrics)
