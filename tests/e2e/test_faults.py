"""Restart safety under fault injection, a few runs of ``python -m bench faults``.

Two service replicas; a replica is SIGKILLed at an armed point of the service or after a
delay, and restarted. Every run must end with the resize actuated, its reservation
released, each victim evicted at most once and no pod evicted beyond the three needed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from harness.fault_rig import FaultRig
from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e


@pytest.fixture
def rig(cluster: Cluster) -> Iterator[FaultRig]:
    rig = FaultRig(
        cluster.client,
        cluster.kubeconfig,
        cluster.binaries.kubectl,
        cluster.control_plane.state_dir,
        cluster.control_plane.log_dir / "audit.log",
        cluster.nodes.known_pods,
        rng=random.Random(5),
        log=lambda line: None,
    ).start()
    yield rig
    rig.stop()


@pytest.mark.parametrize(
    ("role", "fault"),
    [
        # Between two evictions: the second was made, the ledger does not know it yet.
        pytest.param("leader", "evicted:2", id="leader-killed-between-evictions"),
        # Right after the first eviction: nothing in the ledger says it happened (nothing
        # ever does; the successor reads the victim terminating).
        pytest.param("leader", "evicted:1", id="leader-killed-right-after-an-eviction"),
        pytest.param("follower", "delay 0.3s", id="follower-killed-after-admission"),
    ],
)
def test_a_killed_replica_loses_nothing_and_evicts_nobody_twice(
    rig: FaultRig, role: str, fault: str
) -> None:
    result = rig.run_once(0, role=role, fault=fault)

    assert result.actuated, result
    assert result.released, result
    assert result.double_evictions == 0, result
    assert result.unneeded_evictions == 0, result
    assert result.preempted_events_max == 1, result
    assert len(result.evicted) == 3, result
    if role == "leader":
        assert result.killed, f"the armed point {fault} was never reached: {result}"
