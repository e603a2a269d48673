"""The victim evictor port's contract, one suite for the doubles and the evictor.

Every test here runs over each evictor, through the ``subject`` fixture: the doubles
:class:`harness.doubles.FakeEvictor`, its :class:`~harness.doubles.LoggingEvictor` and
:class:`harness.fault_hooks.FaultEvictor` (nothing armed) around it, acting on a
:class:`~webhook.engine.memory.FixedClusterView` of objects kept in memory ("fixed-*");
and :class:`webhook.kube.evictor.Evictor` (the Eviction API), bare and inside the
``FaultEvictor``, against the real API server ("cache-*"). Victims are bound to a node no
kubelet serves: an evicted one stays terminating, so a second call finds it leaving.
Together they prove that an evictor (:class:`~webhook.engine.ledger.VictimEvictor`):

* evicts a live victim (``evicted``), which is leaving from then on;
* is idempotent: a second call for an evicted victim is done, never ``failed``;
* answers ``gone`` for a victim that does not exist, and for one replaced under the same
  name (the uid precondition), and leaves the new pod alone;
* answers ``skipped-terminating`` for a victim already leaving, unless the caller has
  just seen it live;
* answers ``blocked-by-pdb`` (not done) for a running victim a budget forbids to
  disrupt, and leaves it running; a budget holds no victim that is not running (pending
  or terminal: the Eviction API ignores budgets for those), nor one it does not select;
* never raises: a world it cannot reach is ``failed``.

``-k fixed`` runs the doubles' half without a control plane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.doubles import FakeEvictor, LoggingEvictor
from harness.fault_hooks import Fault, FaultEvictor
from tests.e2e.contract_world import (
    MemoryWorld,
    World,
    ghost,
    make_world,
    pdb_doc,
    pod_doc,
    unreachable_kubeconfig,
)
from webhook.core.model import PodRef
from webhook.engine.ledger import EvictionResult, VictimEvictor

PREEMPTOR = PodRef("default", "high-priority-pod", "uid-of-the-preemptor")


@dataclass
class Subject:
    world: World
    evictor: VictimEvictor
    #: Whether the victim is leaving (or gone) in the evictor's world.
    leaving: Callable[[PodRef], bool]
    #: The same evictor kind, on a world it cannot reach.
    unreachable: Callable[[], VictimEvictor]


def _fake(world: World, wrap: str) -> Subject:
    evictor = LoggingEvictor([], world.view()) if wrap == "logging" else FakeEvictor(world.view())

    def leaving(ref: PodRef) -> bool:
        pod = world.pod(ref.name, ref.namespace)
        return pod is None or pod.uid != ref.uid or pod.terminating or ref.uid in evictor.evicted

    def wrapped(inner: FakeEvictor) -> VictimEvictor:
        return FaultEvictor(inner, Fault()) if wrap == "fault" else inner

    return Subject(world, wrapped(evictor), leaving, lambda: wrapped(FakeEvictor(None)))


def _real(world: World, wrap: str, cluster: Any, tmp: Path) -> Subject:
    from webhook.base.metrics import Metrics
    from webhook.kube.client import make_api_client
    from webhook.kube.evictor import Evictor

    clients: list[Any] = []

    def evictor(kubeconfig: str) -> VictimEvictor:
        client = make_api_client(kubeconfig)
        clients.append(client)
        # As the preemption worker builds it: no retry of a budget's refusal in the call.
        made = Evictor(client, None, Metrics(), pdb_retries=0, max_retries=1, request_timeout=3)
        return FaultEvictor(made, Fault()) if wrap == "fault" else made

    def leaving(ref: PodRef) -> bool:
        stored = world.stored_pod(ref.name, ref.namespace)
        meta = {} if stored is None else stored["metadata"]
        return stored is None or meta["uid"] != ref.uid or "deletionTimestamp" in meta

    def unreachable() -> VictimEvictor:
        return evictor(unreachable_kubeconfig(cluster, tmp))

    subject = Subject(world, evictor(str(cluster.kubeconfig)), leaving, unreachable)
    subject.clients = clients  # type: ignore[attr-defined]
    return subject


@pytest.fixture(
    params=[
        pytest.param(("fixed", "fake"), id="fixed-fake"),
        pytest.param(("fixed", "logging"), id="fixed-logging"),
        pytest.param(("fixed", "fault"), id="fixed-fault"),
        pytest.param(("cache", "evictor"), id="cache-evictor", marks=pytest.mark.e2e),
        pytest.param(("cache", "fault"), id="cache-fault", marks=pytest.mark.e2e),
    ]
)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    kind, wrap = request.param
    for world in make_world(request, kind):
        if isinstance(world, MemoryWorld):
            yield _fake(world, wrap)
        else:
            cluster, tmp = request.getfixturevalue("cluster"), request.getfixturevalue("tmp_path")
            made = _real(world, wrap, cluster, tmp)
            yield made
            for client in made.clients:  # type: ignore[attr-defined]
                client.close()


def ref_of(stored: dict[str, Any]) -> PodRef:
    meta = stored["metadata"]
    return PodRef(meta["namespace"], meta["name"], meta["uid"])


def running(subject: Subject, name: str, **labels: str) -> PodRef:
    """A running victim on a node no kubelet serves."""
    doc = pod_doc(name, ghost(), phase="Running", labels=labels or {"app": name})
    return ref_of(subject.world.create(doc))


def evict(subject: Subject, victim: PodRef, *, seen_live: bool = False) -> EvictionResult:
    return subject.evictor.evict(victim, PREEMPTOR, ghost(), seen_live=seen_live)


SEEN_LIVE = pytest.mark.parametrize(
    "seen_live", [pytest.param(False, id="read"), pytest.param(True, id="seen-live")]
)


# -- a live victim ---------------------------------------------------------------------------


@SEEN_LIVE
def test_a_live_victim_is_evicted_and_leaving_from_then_on(
    subject: Subject, seen_live: bool
) -> None:
    victim = running(subject, "victim")

    assert EvictionResult.EVICTED == evict(subject, victim, seen_live=seen_live)
    assert subject.leaving(victim)
    assert EvictionResult.SKIPPED_TERMINATING == evict(subject, victim)


@pytest.mark.parametrize(
    ("again_seen_live", "expected"),
    [
        pytest.param(False, EvictionResult.SKIPPED_TERMINATING, id="read"),
        pytest.param(True, EvictionResult.EVICTED, id="seen-live"),
    ],
)
def test_a_second_evict_of_an_evicted_victim_is_done(
    subject: Subject, again_seen_live: bool, expected: EvictionResult
) -> None:
    victim = running(subject, "victim")
    assert EvictionResult.EVICTED == evict(subject, victim, seen_live=True)

    again = evict(subject, victim, seen_live=again_seen_live)

    assert expected == again
    assert again.done


# -- victims not there to evict --------------------------------------------------------------


@SEEN_LIVE
def test_a_victim_that_does_not_exist_is_gone(subject: Subject, seen_live: bool) -> None:
    other = running(subject, "other")
    missing = PodRef(other.namespace, "missing", "uid-of-nobody")

    assert EvictionResult.GONE == evict(subject, missing, seen_live=seen_live)
    assert not subject.leaving(other)


@SEEN_LIVE
def test_a_victim_replaced_under_its_name_is_gone_and_the_new_pod_stays(
    subject: Subject, seen_live: bool
) -> None:
    old = running(subject, "victim")
    subject.world.delete_pod("victim", grace=0)
    new = running(subject, "victim")

    assert EvictionResult.GONE == evict(subject, old, seen_live=seen_live)
    assert not subject.leaving(new)


def test_a_victim_already_leaving_is_skipped(subject: Subject) -> None:
    victim = running(subject, "victim")
    subject.world.delete_pod("victim")

    assert EvictionResult.SKIPPED_TERMINATING == evict(subject, victim)


# -- disruption budgets ----------------------------------------------------------------------


@SEEN_LIVE
def test_a_victim_a_budget_forbids_to_disrupt_is_blocked_and_stays(
    subject: Subject, seen_live: bool
) -> None:
    subject.world.create(pdb_doc("guard", {"app": "guarded"}))
    victim = running(subject, "victim", app="guarded")

    result = evict(subject, victim, seen_live=seen_live)

    assert EvictionResult.BLOCKED_BY_PDB == result
    assert not result.done
    assert not subject.leaving(victim)


@pytest.mark.parametrize(
    "phase",
    [
        pytest.param("", id="pending"),
        pytest.param("Succeeded", id="succeeded"),
        pytest.param("Failed", id="failed"),
    ],
)
def test_a_budget_does_not_hold_a_victim_that_is_not_running(subject: Subject, phase: str) -> None:
    subject.world.create(pdb_doc("guard", {"app": "guarded"}))
    doc = pod_doc("victim", ghost(), phase=phase, labels={"app": "guarded"})
    victim = ref_of(subject.world.create(doc))

    assert EvictionResult.EVICTED == evict(subject, victim, seen_live=True)
    assert subject.leaving(victim)


def test_a_budget_selecting_other_pods_blocks_nothing(subject: Subject) -> None:
    subject.world.create(pdb_doc("guard", {"app": "guarded"}))
    victim = running(subject, "victim", app="free")

    assert EvictionResult.EVICTED == evict(subject, victim, seen_live=True)


# -- never raises ----------------------------------------------------------------------------


def test_a_world_it_cannot_reach_is_failed_not_raised(subject: Subject) -> None:
    victim = running(subject, "victim")

    result = subject.unreachable().evict(victim, PREEMPTOR, ghost())

    assert EvictionResult.FAILED == result
    assert not subject.leaving(victim)
