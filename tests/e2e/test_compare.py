"""This webhook vs kube-scheduler v1.37.2 (KEP-5836): the victims of every small scenario.

Runs ``bench.compare``'s victim scenarios once on each side - ``ours`` (webhook registered,
alpha gate off) and ``upstream`` (``InPlacePodVerticalScalingSchedulerPreemption=true`` on
every component, no webhook) - each on its own local control plane, then asserts:

* where upstream does not over-preempt, both sides pick exactly the same victims;
* where it does (a neighbour's pending, unallocated resize counted at its desired size),
  we pick strictly fewer, and enough: our resize is actuated too;
* the one deliberate policy difference: a candidate whose eviction a PodDisruptionBudget
  forbids is deleted by the scheduler (plain DELETE) and left alone by us (Eviction API,
  ``pdb-mode: respect``) - and with ``--eviction-method delete --pdb-mode best-effort``
  our webhook picks the scheduler's victims there too;
* with ``--victim-order movable-first`` (our side's setting), of two equally important
  candidates we evict the one a ReplicaSet recreates on another node with room, where
  the scheduler evicts the later started, bare one: no pod is lost on our side;
* every victim's work is lost or running again as the scenario says (a bare victim is
  lost, a ReplicaSet's is replaced on another node).

Both sides are started once for the module (about two minutes in all), and the webhook set
up like the scheduler once more for the two PDB scenarios.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.compare import scenarios as sc
from harness.compare.runner import Measured, compare
from harness.compare.sides import UPSTREAM_POLICY
from tests.e2e.conftest import SCHEDULER_GATE, UPSTREAM_WHY

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.needs_kube(37, UPSTREAM_WHY),
    pytest.mark.needs_gate(SCHEDULER_GATE, UPSTREAM_WHY),
]

SCENARIOS = {s.name: s for s in sc.victim_scenarios() if s.victim_relevant}
#: Where upstream over-preempts (KEP-5836 "Risk of Additional Preemption").
OVER_PREEMPTED = {"pending-neighbour"}
#: Where our default PDB handling differs on purpose.
PDB_BLOCKED = {"pdb-only-candidate"}
#: Where a PodDisruptionBudget steers the choice or forbids the only candidate.
PDB_SCENARIOS = {"pdb-choice", *PDB_BLOCKED}
#: Where we evict a pod whose work moves to another node, and upstream one whose work is lost.
MOVED = {"move-dont-lose"}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Measured]]]:
    root = tmp_path_factory.mktemp("compare")
    yield compare(list(SCENARIOS.values()), repeat=1, state_root=root)


@pytest.fixture(scope="module")
def upstream_policy(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Measured]]:
    """The PDB scenarios once more, on our webhook set up as the scheduler behaves."""
    root = tmp_path_factory.mktemp("compare-upstream-policy")
    chosen = [SCENARIOS[name] for name in sorted(PDB_SCENARIOS)]
    yield compare(chosen, sides=[UPSTREAM_POLICY], state_root=root)[UPSTREAM_POLICY]


def names(measured: Measured) -> set[str]:
    return {v.split("/", 1)[1] for v in measured.victims}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_victims_as_expected_on_both_sides(
    results: dict[str, dict[str, Measured]], scenario: str
) -> None:
    expected = SCENARIOS[scenario].expected
    assert expected is not None
    for side in ("ours", "upstream"):
        measured = results[side][scenario]
        assert not measured.kubectl_errors, measured.kubectl_errors
        assert names(measured) == set(expected[side]), f"{side} {scenario}"


@pytest.mark.parametrize("scenario", sorted(set(SCENARIOS) - OVER_PREEMPTED - PDB_BLOCKED - MOVED))
def test_same_victims_where_upstream_does_not_over_preempt(
    results: dict[str, dict[str, Measured]], scenario: str
) -> None:
    assert names(results["ours"][scenario]) == names(results["upstream"][scenario])


@pytest.mark.parametrize("scenario", sorted(OVER_PREEMPTED))
def test_strictly_fewer_victims_where_upstream_over_preempts(
    results: dict[str, dict[str, Measured]], scenario: str
) -> None:
    ours, upstream = results["ours"][scenario], results["upstream"][scenario]
    assert names(ours) < names(upstream)
    # Fewer, and still enough: both resizes were actuated.
    assert ours.actuated_ms is not None
    assert upstream.actuated_ms is not None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_pods_lost_as_expected_on_both_sides(
    results: dict[str, dict[str, Measured]], scenario: str
) -> None:
    """Without ``lost`` in the scenario, every victim is a bare pod: all of them are lost."""
    s = SCENARIOS[scenario]
    expected = s.lost if s.lost is not None else s.expected
    assert expected is not None
    for side in ("ours", "upstream"):
        lost = {v.split("/", 1)[1] for v in results[side][scenario].lost}
        assert set(expected[side]) == lost, f"{side} {scenario}"


@pytest.mark.parametrize("scenario", sorted(MOVED))
def test_we_move_what_upstream_loses(
    results: dict[str, dict[str, Measured]], scenario: str
) -> None:
    ours, upstream = results["ours"][scenario], results["upstream"][scenario]
    assert len(ours.victims) == len(upstream.victims)
    assert [] == ours.lost
    assert len(upstream.lost) == len(upstream.victims)
    assert ours.actuated_ms is not None


@pytest.mark.parametrize("scenario", sorted(PDB_BLOCKED))
def test_pdb_protected_only_candidate(
    results: dict[str, dict[str, Measured]], scenario: str
) -> None:
    ours, upstream = results["ours"][scenario], results["upstream"][scenario]
    assert names(ours) == set()
    assert ours.actuated_ms is None  # stays Deferred: no victim may go
    assert names(upstream) == {"guarded"}  # deleted although its PDB allows no disruption
    assert upstream.actuated_ms is not None


@pytest.mark.parametrize("scenario", sorted(PDB_SCENARIOS))
def test_set_up_like_the_scheduler_we_pick_its_victims(
    results: dict[str, dict[str, Measured]],
    upstream_policy: dict[str, Measured],
    scenario: str,
) -> None:
    """``--eviction-method delete --pdb-mode best-effort``: the PDB difference is our
    default policy, not our accounting; removal goes the scheduler's way too."""
    ours, upstream = upstream_policy[scenario], results["upstream"][scenario]
    assert not ours.kubectl_errors, ours.kubectl_errors
    assert names(upstream) == names(ours)
    assert ours.actuated_ms is not None
    assert len(ours.victims) == ours.breakdown.get("delete pods", 0)
    assert 0 == ours.breakdown.get("create pods/eviction", 0)


def test_each_side_did_the_preempting_itself(results: dict[str, dict[str, Measured]]) -> None:
    """Victims went the way each component removes pods: we evict (``pods/eviction``);
    kube-scheduler patches the DisruptionTarget condition and DELETEs."""
    for scenario in SCENARIOS:
        ours, upstream = results["ours"][scenario], results["upstream"][scenario]
        assert ours.breakdown.get("create pods/eviction", 0) == len(ours.victims), scenario
        # kube-scheduler runs preemption again for a resize still Deferred while its victim
        # terminates, and marks and DELETEs the same victim again (docs/reliability.md,
        # "Both preemptors on"): at least one mark and one DELETE per victim.
        assert upstream.breakdown.get("delete pods", 0) >= len(upstream.victims), scenario
        assert upstream.breakdown.get("patch pods/status", 0) >= len(upstream.victims), scenario
