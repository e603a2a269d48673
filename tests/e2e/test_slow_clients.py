"""Idle and slow clients held open against the real service while kube-apiserver calls it.

Before the gevent worker, 8 idle TLS connections (or 20 bodies sent a byte a second) took
every gunicorn thread: kube-apiserver timed out, failed open, and the resize went through
with nobody preempted and no warning. Here hundreds of such connections stay open while
``kubectl patch --subresource resize`` runs; the webhook still answers, warns, and the
victim is preempted. Bounded: a fixed set of loopback connections, closed at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.hostile_clients import held_open
from harness.webhook_process import WebhookProcess, start_webhook
from tests.e2e.conftest import NODE, Cluster, Kubectl, Waiter, victim_leaves
from tests.e2e.service_support import (
    actual_cpu,
    as_warning,
    clear_ledger,
    events,
    kubectl_warnings,
    pod_manifest,
    read_pod,
    resize,
    run_pods,
)
from tests.unit.web_fixtures import p99, review_latency

pytestmark = [pytest.mark.e2e, pytest.mark.solo]


@pytest.fixture
def service(cluster: Cluster, namespace: str) -> Iterator[WebhookProcess]:
    """The service as deployed (``serve``'s defaults), registered, with an empty ledger.

    Without ``client-ca``: where kube-apiserver cannot present a client certificate, a
    hostile client completes its TLS handshake, and the serving path must hold up anyway.
    """
    clear_ledger(cluster)
    process = start_webhook(
        cluster.client, cluster.kubeconfig, cluster.control_plane.state_dir, client_auth=False
    )
    yield process
    process.stop()
    clear_ledger(cluster)


def test_held_connections_do_not_switch_preemption_off(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: WebhookProcess,
    wait_until: Waiter,
    tmp_path: Path,
) -> None:
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(service.ca_pem)
    run_pods(
        kubectl,
        [
            pod_manifest("low-priority-pod", "3", priority_classes["low"], memory="500Mi"),
            pod_manifest("high-priority-pod", "4", priority_classes["high"], memory="1Gi"),
        ],
    )

    # 8 idle TLS connections as issue 15 found them, 200 more, 20 bodies and 20 header
    # blocks sent a byte a second - all held while the resize is made.
    with held_open(service.port, ca_file, idle=208, slow_headers=20, slow_bodies=20) as clients:
        assert 0 == clients.handshakes_failed
        result = resize(kubectl, "high-priority-pod", "6")
        # Reviews of a pod the cache does not know: the serving path alone, new
        # connections each, as kube-apiserver opens them when its pool is busy.
        latencies = [
            review_latency(service.port, ca_file, uid=f"held-{i}", timeout=5) for i in range(50)
        ]

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"preempting 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
        )
    ] == kubectl_warnings(result)
    assert float("inf") not in latencies
    assert p99(latencies) < 0.100, f"p99 {p99(latencies) * 1000:.1f} ms"
    wait_until(
        lambda: (p := read_pod(cluster, namespace, "high-priority-pod")) and actual_cpu(p) == "6",
        timeout=30,
        what="the resize to be actuated at 6 CPU",
    )
    victim_leaves(cluster, namespace, "low-priority-pod", wait_until)
    assert 1 == len(events(kubectl, "low-priority-pod", "Preempted"))
