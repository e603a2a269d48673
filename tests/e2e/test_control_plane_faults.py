"""The control plane under the webhook breaks: a few runs of ``python -m bench faults
--fault control-plane``.

Two service replicas, a 3-victim plan on node-1. kube-apiserver is SIGKILLed at a point
of the plan and started again on the same etcd and port; etcd is stalled (SIGSTOP) or
killed while the admission writes its entry. Every run must end with the resize
actuated, its reservation released, each victim evicted at most once, no pod evicted
beyond the three needed, and every replica ready again (its watches back).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from harness.fault_rig import FaultRig, RunResult
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
        rng=random.Random(11),
        log=lambda line: None,
        control_plane=cluster.control_plane,
    ).start()
    yield rig
    rig.stop()


def assert_nothing_lost(result: RunResult) -> None:
    assert result.actuated, result
    assert result.released, result
    assert result.double_evictions == 0, result
    assert result.unneeded_evictions == 0, result
    assert result.preempted_events_max == 1, result
    assert len(result.evicted) == 3, result
    assert result.ready_after, result


@pytest.mark.parametrize(
    "fault",
    [
        # The worker holds between its first and second eviction while the API server dies.
        pytest.param("evicted:1:pause", id="killed-between-two-evictions"),
        # The entry is written, the review not answered yet: the patch fails and is made
        # again, the first entry is superseded by the second review's.
        pytest.param("admitted:1:pause", id="killed-before-the-review-is-answered"),
        pytest.param("delay 0.80s", id="killed-just-after-the-resize"),
    ],
)
def test_kube_apiserver_killed_and_started_again_loses_nothing(rig: FaultRig, fault: str) -> None:
    result = rig.run_control_plane(0, "kube-apiserver", fault=fault)

    assert_nothing_lost(result)
    if fault.endswith(":pause"):
        assert result.killed, f"the point {fault} was never reached: {result}"


@pytest.mark.parametrize("kind", ["etcd-stall", "etcd-restart"])
def test_etcd_broken_during_admission_fails_open_and_the_reconciler_takes_over(
    rig: FaultRig, kind: str
) -> None:
    result = rig.run_control_plane(0, kind)

    assert result.killed, f"the admission's ledger write was never reached: {result}"
    assert result.failed_open, result.warning
    assert result.evictions_at_answer == 0, result
    # A write stuck in a stalled etcd lands when it runs again: void, and dropped.
    assert not result.admission_entry_left, result
    if kind == "etcd-stall":
        assert result.reconciler_planned, result
    assert_nothing_lost(result)
