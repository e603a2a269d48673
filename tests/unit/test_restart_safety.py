"""Restart safety of the worker and the reconciler over a shared ledger.

A "crash" is a BaseException thrown out of the worker mid-pass (nothing after it runs, as
with SIGKILL); a new worker over the same ledger plays the restarted leader.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from harness.doubles import FakeEvictor, InMemoryLedger, StaticClusterView
from tests.unit.test_worker import Clock, Cluster, add, make_worker
from tests.unit.test_worker_logic import ADMITTED, CONFIG, NODE, entry, pod
from webhook.core.model import Pod, PodRef
from webhook.engine.ledger import EvictionResult
from webhook.engine.lifecycle.next_step import Release, next_action
from webhook.engine.lifecycle.states import room_holders
from webhook.engine.reconciler import Reconciler
from webhook.engine.worker import PreemptionWorker


class Crash(BaseException):
    """The process died here."""


# 8 CPUs: "high" holds 2 and asks for 5 (deferred); three 1-CPU victims; "mid" holds 3.
HIGH = pod("high", cpu="5", allocated="2", priority=1000, resize="Deferred")
LOWS = tuple(pod(f"low-{c}", cpu="1", start=f"2024-01-01T0{i}:00:00Z") for i, c in enumerate("abc"))
MID = pod("mid", cpu="3", priority=2000)
VICTIMS = ("low-c", "low-b", "low-a")  # least important first


def scene(*leaving: str, gone: tuple[str, ...] = ()) -> tuple[Pod, ...]:
    pods = [HIGH, MID]
    for p in LOWS:
        if p.name in gone:
            continue
        pods.append(replace(p, terminating=True) if p.name in leaving else p)
    return tuple(pods)


class World:
    """The cluster as the API server has it; evictions make victims terminate."""

    def __init__(self) -> None:
        self.cluster = Cluster(*scene())
        self.leaving: list[str] = []
        self.calls: Counter[str] = Counter()

    def evicted(self, victim: PodRef) -> None:
        self.calls[victim.name] += 1
        self.leaving.append(victim.name)
        self.cluster.set(*scene(*self.leaving))


def worker_for(
    world: World, ledger: InMemoryLedger, clock: Clock, crash_after: int | None = None
) -> tuple[PreemptionWorker, FakeEvictor]:
    evictor = FakeEvictor()
    done = [0]

    def on_evict(victim: PodRef) -> None:
        world.evicted(victim)
        done[0] += 1
        if crash_after is not None and done[0] == crash_after:
            raise Crash  # after the API call, before the ledger knows

    evictor.on_evict = on_evict
    return make_worker(world.cluster, ledger, evictor, clock), evictor


@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_a_crash_after_any_eviction_never_evicts_twice(crash_after: int) -> None:
    world, ledger, clock = World(), InMemoryLedger(), Clock()
    add(ledger, entry(*VICTIMS, desired_cpu=5000, persisted=True))

    first, _ = worker_for(world, ledger, clock, crash_after)
    with pytest.raises(Crash):
        first.run_once()
    # No eviction is recorded in the ledger: the restarted leader reads the victims
    # terminating in its cache.
    [e] = ledger.all_entries()
    assert frozenset() == e.handled

    second, _ = worker_for(world, ledger, clock)
    second.run_once()
    second.run_once()

    assert world.calls == {v: 1 for v in VICTIMS}


def test_a_crash_before_the_first_eviction_resumes_from_the_ledger() -> None:
    world, ledger, clock = World(), InMemoryLedger(), Clock()
    add(ledger, entry(*VICTIMS, desired_cpu=5000, persisted=True))
    # The previous leader died right after the reconciler's write: nothing else happened.
    second, _ = worker_for(world, ledger, clock)
    second.run_once()
    assert world.calls == {v: 1 for v in VICTIMS}


def test_the_reconcilers_entry_survives_a_crash_and_is_not_planned_twice() -> None:
    world, ledger, clock = World(), InMemoryLedger(), Clock(ADMITTED)
    view = StaticClusterView([NODE], scene())
    [outcome] = Reconciler(CONFIG, view, ledger, clock=clock).reconcile()
    assert outcome.admitted and outcome.plan is not None
    assert tuple(v.pod.name for v in outcome.plan.victims) == VICTIMS

    # Restarted leader: a fresh reconciler sees the live entry and leaves it to the worker.
    assert Reconciler(CONFIG, view, ledger, clock=clock).reconcile() == []
    worker, _ = worker_for(world, ledger, clock)
    worker.run_once()
    assert world.calls == {v: 1 for v in VICTIMS}


def test_room_that_appears_before_a_retry_spares_the_victim_left() -> None:
    world, ledger, clock = World(), InMemoryLedger(), Clock()
    add(ledger, entry(*VICTIMS, desired_cpu=5000, persisted=True))
    worker, evictor = worker_for(world, ledger, clock)
    evictor.results["low-a"] = EvictionResult.FAILED

    def and_mid_goes(victim: PodRef) -> None:
        if victim.name != "low-a":
            world.evicted(victim)
        # Meanwhile "mid" was deleted by its owner: 3 CPUs are free.
        world.cluster.set(*(p for p in scene(*world.leaving) if p.name != "mid"))

    evictor.on_evict = and_mid_goes
    worker.run_once()
    clock.now += worker.backoff.policy.cap
    worker.run_once()

    assert [("low-a", "high", "node-1")] == [c for c in evictor.calls if c[0] == "low-a"]
    assert {"low-c": 1, "low-b": 1} == world.calls


def test_a_replica_that_lost_its_lease_stops_between_victims_waiting_their_turn() -> None:
    world, ledger, clock = World(), InMemoryLedger(), Clock()
    add(ledger, entry(*VICTIMS, desired_cpu=5000, persisted=True))
    worker, _ = worker_for(world, ledger, clock)
    worker.victim_parallelism = 1  # the others wait for a turn
    leading = [True]
    worker.may_act = lambda: leading[0]
    world_evicted = world.evicted

    def lose_lease(victim: PodRef) -> None:
        world_evicted(victim)
        leading[0] = False

    worker.evictor.on_evict = lose_lease  # type: ignore[attr-defined]
    worker.run_once()

    assert world.calls == {"low-c": 1}
    # The next leader resumes from the ledger and the cache: the rest, once each.
    successor, _ = worker_for(world, ledger, clock)
    successor.run_once()
    assert world.calls == {v: 1 for v in VICTIMS}


def test_victims_that_no_longer_suffice_go_back_to_the_reconciler() -> None:
    """Room disappeared (a pod arrived) after low-c was evicted: the entry is released and
    the reconciler plans again, never re-choosing low-c."""
    ledger, clock = InMemoryLedger(), Clock()
    e = entry(*VICTIMS, desired_cpu=5000, persisted=True, handled=("low-c",))
    add(ledger, e)
    # A newcomer took 1 CPU: low-a and low-b are no longer enough, the newcomer must go too.
    newcomer = pod("newcomer", cpu="1", priority=10)
    pods = (*scene("low-c"), newcomer)
    action = next_action(
        e,
        HIGH,
        NODE,
        pods,
        now=clock(),
        config=CONFIG,
        budgets=(),
    )
    assert isinstance(action, Release) and action.reason == "replan"

    ledger.update(NODE.name, lambda es: ((), None))
    view = StaticClusterView([NODE], pods)
    [outcome] = Reconciler(CONFIG, view, ledger, clock=clock).reconcile()
    assert outcome.plan is not None
    chosen = {v.pod.name for v in outcome.plan.victims}
    assert "low-c" not in chosen and "newcomer" in chosen


def test_no_reservation_outlives_its_ttl() -> None:
    world, ledger, clock = World(), InMemoryLedger(), Clock()
    e = entry(*VICTIMS, desired_cpu=5000, persisted=True)
    add(ledger, e)
    clock.now = e.expires_at
    worker, _ = worker_for(world, ledger, clock)
    worker.run_once()

    # Nobody counts it any more; the next write to the node's ledger drops it.
    assert () == room_holders(ledger.all_entries(), scene(), clock.now)
    assert world.calls == {}
