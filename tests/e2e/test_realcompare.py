"""The real-node comparison's measurement on the session's real cluster: our side's
walkthrough scaled to node-1, its victim a process that takes 2 s after SIGTERM
(``python -m bench.realcompare`` runs it on both sides, at grace 0 and 5 s)."""

from __future__ import annotations

import pytest

from harness.compare import scenarios as sc
from harness.compare.realnode import RealScenarioRun, RealSide, scaled
from harness.realcluster import RealCluster
from tests.e2e.conftest import SCHEDULER_GATE, UPSTREAM_WHY

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.realnode,
    pytest.mark.needs_kube(37, UPSTREAM_WHY),
    pytest.mark.needs_gate(SCHEDULER_GATE, UPSTREAM_WHY),
]
VICTIM_GRACE = 2


def test_the_scaled_walkthrough_is_measured_with_the_victims_grace(
    real_cluster: RealCluster,
) -> None:
    side = RealSide.around(real_cluster, "ours")
    side.wait_leader()
    free = real_cluster.allocatable_millicores() - real_cluster.requested_millicores()
    run = RealScenarioRun(side, scaled(sc.walkthrough(), free), "smoke", print, VICTIM_GRACE)

    measured = run.run()

    assert ([f"{run.namespace}/low-priority-pod"], []) == (
        measured.victims,
        measured.kubectl_errors,
    )
    assert measured.first_eviction_ms is not None and measured.actuated_ms is not None
    # The resize waits for the victim's process, which sleeps its grace after SIGTERM.
    assert measured.actuated_ms - measured.first_eviction_ms >= VICTIM_GRACE * 1000
    real_cluster.client.delete(f"/api/v1/namespaces/{run.namespace}")
