"""A review flood against the service itself - its Lease ledger, its cluster cache, a real
kubelet - while one real resize goes through (quick variant of ``python -m bench
flood-cluster``, which runs it for 60 s).

The flood's reviews are resizes of live pods that the API server never persists: each one
decided writes a ledger entry that plans a victim, and none may cost a pod. Afterwards:
no 5xx, no wrong answer, bounded timeouts and memory, the service alive and ready; within
``persist_timeout`` and a margin no entry of the flood holds room, and the Lease never
stored more than one per pod; the real resize was actuated with exactly its plan's victim
evicted (once), and its entry released.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cluster_flood import (
    GROWERS,
    LOWS,
    PREEMPTOR,
    ClusterFlood,
    failures,
)
from harness.webhook_process import NAMESPACE
from tests.e2e.conftest import Cluster, Kubectl, StartService
from tests.e2e.service_support import entries_of, events, ledger_entries

pytestmark = [pytest.mark.e2e, pytest.mark.solo]

#: Seconds of flood: long enough for entries of the flood to be superseded, spent and
#: dropped many times over, and for the real resize to be planned in the middle of it.
SECONDS = 12.0


def test_review_flood_costs_no_pod_and_leaves_no_reservation(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    tmp_path: Path,
) -> None:
    service = start_service()
    rig = ClusterFlood(
        cluster.client,
        cluster.binaries.kubectl,
        cluster.kubeconfig,
        cluster.control_plane.log_dir / "audit.log",
        service,
        cluster.control_plane.state_dir / "logs" / "webhook.log",
        namespace=namespace,
        classes=priority_classes,
        ledger_namespace=NAMESPACE,
        workdir=tmp_path,
    )

    run = rig.run(SECONDS, factor=4.0, saturation_seconds=4.0)

    summary = run.summary()
    assert [] == failures(run), summary
    # The flood was one: most reviews reached the ledger, or were refused by it at once.
    assert run.counts.get("full", 0) + run.counts.get("failed open", 0) > 0, summary
    # Read again here, from the API server: one Preempted event, for the plan's victim
    # alone; nothing else in the namespace was told it was preempted.
    (victim,) = run.plan_victims
    assert victim in LOWS, summary
    for name in (PREEMPTOR, *GROWERS, *LOWS):
        expected = 1 if name == victim else 0
        assert expected == len(events(kubectl, name, "Preempted")), name
    # The Lease holds no more than one (spent) entry per grower and the preemptor's.
    stored = entries_of(ledger_entries(cluster), namespace)
    assert len({e["pod"]["name"] for e in stored}) == len(stored), stored
