"""Deferred resizes end to end: the running service (real ``python -m webhook serve``
replicas) preempts for resizes the kubelet deferred, whatever the webhook saw of them.

kubectl makes every change; the (hollow) kubelet defers a resize that
does not fit and actuating it once room appears.
"""

from __future__ import annotations

import json
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.audit import eviction_codes
from harness.kubeapi import ApiError
from harness.replicas import ReplicaSet, start_replicas
from harness.webhook_process import unregister
from tests.e2e.conftest import Cluster, Kubectl, Waiter, client_auth_of, victim_leaves
from tests.e2e.service_support import (
    actual_cpu,
    pod_manifest,
    read_pod,
    resize,
    resize_pending,
    run_pods,
)

pytestmark = pytest.mark.e2e

LEADER_LEASE = "resize-preemption-webhook-leader"
LEASE_DURATION = 3
#: Room for a loaded 2-core machine running other clusters.
SLOW = 40.0

StartReplicas = Callable[..., ReplicaSet]


@pytest.fixture
def replicas(cluster: Cluster, service_mode: str) -> Iterator[StartReplicas]:
    """``replicas(count=1, register=True, *flags)``: service replicas with their own
    service namespace (fresh ledger and leader Lease), in the session's ``service_mode``;
    stopped when the test ends."""
    started: list[ReplicaSet] = []

    def start(*flags: str, count: int = 1, register: bool = True) -> ReplicaSet:
        unregister(cluster.client)
        service_ns = f"rpw-{secrets.token_hex(3)}"
        replica_set = start_replicas(
            cluster.client,
            cluster.kubeconfig,
            cluster.control_plane.state_dir,
            count=count,
            namespace=service_ns,
            register_webhook=register,
            extra_args=["--lease-duration", str(LEASE_DURATION), *flags],
            client_auth=client_auth_of(service_mode),
        )
        replica_set.service_namespace = service_ns  # type: ignore[attr-defined]
        started.append(replica_set)
        return replica_set

    yield start
    for replica_set in started:
        replica_set.stop()


def walkthrough(kubectl: Kubectl, classes: dict[str, str]) -> None:
    """node-1, 8 CPUs: low-priority-pod 4, high-priority-pod 2 (to grow to 6), steady 1 (as
    important as high: never a victim)."""
    run_pods(
        kubectl,
        [
            pod_manifest("low-priority-pod", "4", classes["low"]),
            pod_manifest("high-priority-pod", "2", classes["high"]),
            pod_manifest("steady", "1", classes["high"]),
        ],
    )


def events(kubectl: Kubectl, name: str, reason: str) -> list[dict[str, Any]]:
    out = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [e for e in json.loads(out.stdout)["items"] if e.get("reason") == reason]


def evictions(cluster: Cluster, namespace: str) -> dict[str, list[int]]:
    """Eviction requests per pod name from the API server's audit log: response codes."""
    return eviction_codes(cluster.control_plane.log_dir / "audit.log", namespace)


def resized_once_low_is_gone(
    cluster: Cluster, namespace: str, kubectl: Kubectl, wait_until: Waiter, timeout: float = SLOW
) -> None:
    wait_until(
        lambda: actual_cpu(read_pod(cluster, namespace, "high-priority-pod")) == "6",
        timeout=timeout,
        what="the deferred resize to be actuated",
    )
    victim_leaves(cluster, namespace, "low-priority-pod", wait_until)
    assert read_pod(cluster, namespace, "steady") is not None
    assert len(events(kubectl, "low-priority-pod", "Preempted")) == 1
    codes = evictions(cluster, namespace)
    assert list(codes) == ["low-priority-pod"]
    assert [c for c in codes["low-priority-pod"] if c < 300] == [201]


def deferred(cluster: Cluster, namespace: str) -> bool:
    return resize_pending(read_pod(cluster, namespace, "high-priority-pod")) == "Deferred"


def test_a_resize_made_without_the_webhook_is_preempted_for_by_the_running_service(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
) -> None:
    replicas(register=False)  # running and leading, but the API server never calls it
    walkthrough(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "6")

    assert result.returncode == 0 and "Warning" not in result.stderr
    resized_once_low_is_gone(cluster, namespace, kubectl, wait_until)
    if cluster.binaries.kube_version[1] >= 35:  # no ResizeDeferred event before 1.35
        assert events(kubectl, "high-priority-pod", "ResizeDeferred")  # the kubelet deferred it
    [told] = events(kubectl, "high-priority-pod", "DeferredResizePreemption")
    assert told["message"].endswith(f"{namespace}/low-priority-pod")
    # The reconciler's event is the one on the resizing pod: nothing else told its owner.
    assert [] == events(kubectl, "high-priority-pod", "PreemptingForResize")


def test_a_resize_made_while_the_service_was_down_is_picked_up_on_start(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
) -> None:
    service = replicas()
    walkthrough(kubectl, priority_classes)
    [replica] = service.replicas
    replica.kill(signal.SIGTERM)

    result = resize(kubectl, "high-priority-pod", "6")  # failurePolicy Ignore: allowed
    assert result.returncode == 0
    wait_until(lambda: deferred(cluster, namespace), timeout=SLOW, what="the kubelet to defer")
    time.sleep(1)
    assert read_pod(cluster, namespace, "low-priority-pod") is not None

    replica.start()  # cold start: every Deferred pod is planned

    resized_once_low_is_gone(cluster, namespace, kubectl, wait_until)


def set_budget(cluster: Cluster, namespace: str, min_available: int) -> None:
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    body = {
        "metadata": {"name": "low"},
        "spec": {
            "minAvailable": min_available,
            "selector": {"matchLabels": {"app": "low-priority-pod"}},
        },
    }
    try:
        cluster.client.create(path, body)
    except ApiError as e:
        if e.status != 409:
            raise
        cluster.client.patch(f"{path}/low", {"spec": {"minAvailable": min_available}})


def disruptions_allowed(cluster: Cluster, namespace: str) -> int | None:
    pdb = cluster.client.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/low")
    status = pdb.get("status") or {}
    if status.get("observedGeneration") != pdb["metadata"]["generation"]:
        return None
    value = status.get("disruptionsAllowed")
    return int(value) if isinstance(value, int) else None


def test_a_budget_blocks_the_victim_until_raised_then_the_reconciler_preempts(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
) -> None:
    """``respect`` (the default): no plan while the budget forbids the only useful victim;
    the budget's status change wakes the reconciler."""
    replicas()
    walkthrough(kubectl, priority_classes)
    set_budget(cluster, namespace, 1)
    wait_until(lambda: disruptions_allowed(cluster, namespace) == 0, timeout=SLOW, what="PDB")

    result = resize(kubectl, "high-priority-pod", "6")
    assert "PodDisruptionBudget" in result.stderr  # the admission's warning
    wait_until(lambda: deferred(cluster, namespace), timeout=SLOW, what="the kubelet to defer")
    time.sleep(3)
    assert read_pod(cluster, namespace, "low-priority-pod") is not None
    assert evictions(cluster, namespace) == {}

    set_budget(cluster, namespace, 0)  # disruptionsAllowed becomes 1

    resized_once_low_is_gone(cluster, namespace, kubectl, wait_until)


def test_an_eviction_a_budget_refused_is_retried_at_once_when_the_budget_allows_it(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
) -> None:
    """``best-effort``: the plan takes the protected victim, the Eviction API refuses (429)
    and the worker backs off (1, 2, 4, 8, 16 s...); raising the budget ends the backoff."""
    replicas("--pdb-mode", "best-effort")
    walkthrough(kubectl, priority_classes)
    set_budget(cluster, namespace, 1)
    wait_until(lambda: disruptions_allowed(cluster, namespace) == 0, timeout=SLOW, what="PDB")

    resize(kubectl, "high-priority-pod", "6")

    def refused(n: int) -> bool:
        codes = evictions(cluster, namespace).get("low-priority-pod", [])
        return len([c for c in codes if c == 429]) >= n

    # After the 5th refusal the next try is 8-16 s away.
    wait_until(lambda: refused(5), timeout=60, interval=0.2, what="five refused evictions")
    set_budget(cluster, namespace, 0)  # disruptionsAllowed becomes 1 (then 0 again)
    raised = time.monotonic()

    wait_until(
        lambda: read_pod(cluster, namespace, "low-priority-pod") is None,
        timeout=SLOW,
        what="the victim to go",
    )
    took = time.monotonic() - raised
    assert took < 7.5, f"eviction {took:.1f} s after the budget was raised"
    wait_until(
        lambda: actual_cpu(read_pod(cluster, namespace, "high-priority-pod")) == "6",
        timeout=SLOW,
        what="the resize to be actuated",
    )
    codes = evictions(cluster, namespace)["low-priority-pod"]
    assert [c for c in codes if c < 300] == [201]
    assert len(events(kubectl, "low-priority-pod", "Preempted")) == 1


def leader(cluster: Cluster, service: ReplicaSet) -> str:
    namespace = service.service_namespace  # type: ignore[attr-defined]
    try:
        lease = cluster.client.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEADER_LEASE}"
        )
    except ApiError:
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def test_a_killed_leader_is_replaced_and_the_work_continues(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
) -> None:
    service = replicas(count=2)
    walkthrough(kubectl, priority_classes)
    first = wait_until(lambda: leader(cluster, service), timeout=SLOW, what="a leader")
    [dead] = [r for r in service.replicas if r.identity == first]
    [survivor] = [r for r in service.replicas if r is not dead]

    dead.kill(signal.SIGKILL)  # holds the Lease until it expires
    killed = time.monotonic()
    result = resize(kubectl, "high-priority-pod", "6")  # answered by the survivor

    assert result.returncode == 0
    assert "preempting 1 lower-priority pod" in result.stderr
    resized_once_low_is_gone(cluster, namespace, kubectl, wait_until)
    took = time.monotonic() - killed
    assert leader(cluster, service) == survivor.identity
    # Lease expiry, plus acquisition retries and the eviction, on a busy machine.
    assert took < LEASE_DURATION + 15, f"took {took:.1f} s"
