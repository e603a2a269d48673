"""The local control plane and its hollow kubelet behave like a cluster with real nodes.

These tests need no webhook: they pin the behaviour every other end-to-end test relies on.
node-1 has 8 CPU and 16Gi and is empty at the start of each test.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from harness.webhook_process import CONFIGURATION_NAME, CONFIGURATION_PATH, start_webhook
from tests.e2e.conftest import (
    GRACE_CAP,
    NODE,
    RESIZE_VALIDATOR,
    Cluster,
    Kubectl,
    Waiter,
    resize_events,
)
from tests.e2e.service_support import wait_running

pytestmark = pytest.mark.e2e

# Speaks the service's command-line contract and allows every resize with a warning, so the
# harness's webhook plumbing (TLS, client certificates, caBundle, rules, registration) is
# tested on its own.
STUB_WEBHOOK = """
import argparse, http.server, json, ssl

parser = argparse.ArgumentParser()
for flag in ("--kubeconfig", "--tls-cert", "--tls-key", "--port", "--metrics-port",
             "--service-namespace", "--client-ca"):
    parser.add_argument(flag)
args = parser.parse_args()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        warning = (f"stub webhook saw {request['operation']} {request['resource']['resource']}/"
                   f"{request['subResource']} of {request['name']}")
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": {"uid": request["uid"], "allowed": True,
                                        "warnings": [warning]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = http.server.ThreadingHTTPServer(("127.0.0.1", int(args.port)), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(args.tls_cert, args.tls_key)
if args.client_ca:
    # Only kube-apiserver, with the control plane's webhook client certificate, gets in.
    context.load_verify_locations(args.client_ca)
    context.verify_mode = ssl.CERT_REQUIRED
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def pod(
    name: str,
    cpu: str,
    memory: str = "256Mi",
    *,
    container: str = "app",
    priority_class: str | None = None,
    labels: dict[str, str] | None = None,
    grace: int | None = None,
    node: str | None = NODE,
) -> dict[str, Any]:
    """A Guaranteed pod (requests = limits) with one container."""
    resources = {"cpu": cpu, "memory": memory}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": container,
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": resources, "limits": resources},
            }
        ]
    }
    if node:
        spec["nodeName"] = node
    if priority_class:
        spec["priorityClassName"] = priority_class
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def apply(kubectl: Kubectl, *objects: dict[str, Any]) -> None:
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def resize(kubectl: Kubectl, name: str, cpu: str, container: str = "app") -> Any:
    patch = {
        "spec": {
            "containers": [
                {"name": container, "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}
            ]
        }
    }
    return kubectl(
        "patch", "pod", name, "--subresource", "resize", "--patch", json.dumps(patch), check=False
    )


def get_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return result


def actual_cpu(p: dict[str, Any]) -> str | None:
    statuses = p.get("status", {}).get("containerStatuses") or []
    return statuses[0].get("resources", {}).get("requests", {}).get("cpu") if statuses else None


def condition(p: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in p.get("status", {}).get("conditions") or [] if c["type"] == kind), None)


def events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.client.get(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name}"
    )["items"]
    return items


def test_a_resize_that_fits_is_actuated(
    cluster: Cluster, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    apply(kubectl, pod("grower", "2"))
    kubectl("wait", "--for=condition=Ready", "pod/grower", "--timeout=20s")

    result = resize(kubectl, "grower", "3")
    assert result.returncode == 0, result.stderr

    resized = wait_until(
        lambda: (p := get_pod(cluster, namespace, "grower")) and actual_cpu(p) == "3" and p,
        what="the resize to be actuated",
    )
    status = resized["status"]["containerStatuses"][0]
    assert status["allocatedResources"] == {"cpu": "3", "memory": "256Mi"}
    assert status["resources"] == {
        "limits": {"cpu": "3", "memory": "256Mi"},
        "requests": {"cpu": "3", "memory": "256Mi"},
    }
    assert condition(resized, "PodResizePending") is None
    assert resized["metadata"]["generation"] == 2
    # PodObservedGenerationTracking: alpha and off in 1.33, on from 1.34.
    if cluster.binaries.kube_version >= (1, 34):
        assert resized["status"]["observedGeneration"] == 2
    expected = resize_events(cluster.binaries)
    wait_until(
        lambda: expected <= {e["reason"] for e in events(cluster, namespace, "grower")},
        what=f"the resize events {sorted(expected)}",
    )


@pytest.mark.needs_kube(
    36,
    "the ResizeDeferred event's message as 1.36 writes it ('Pod resize OutOfcpu'); "
    "test_hollow_kubelet.py holds what each earlier version reports",
)
def test_a_resize_that_does_not_fit_is_deferred_then_retried_when_a_pod_leaves(
    cluster: Cluster, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    apply(kubectl, pod("other", "3"), pod("grower", "4"))
    kubectl("wait", "--for=condition=Ready", "pod/other", "pod/grower", "--timeout=20s")

    assert resize(kubectl, "grower", "6").returncode == 0

    expected = "Node didn't have enough resource: cpu, requested: 6000, used: 3000, capacity: 8000"
    pending = wait_until(
        lambda: condition(get_pod(cluster, namespace, "grower"), "PodResizePending"),
        what="PodResizePending",
    )
    assert pending["status"] == "True"
    assert pending["reason"] == "Deferred"
    assert pending["message"] == expected
    assert pending["observedGeneration"] == 2
    assert actual_cpu(get_pod(cluster, namespace, "grower")) == "4"
    deferred = wait_until(
        lambda: [
            e for e in events(cluster, namespace, "grower") if e["reason"] == "ResizeDeferred"
        ],
        what="the ResizeDeferred event",
    )
    assert deferred[0]["type"] == "Warning"
    assert deferred[0]["source"]["component"] == "kubelet"
    assert deferred[0]["message"].startswith('Pod resize OutOfcpu: {"containers":[{"name":"app"')
    assert deferred[0]["message"].endswith(f'"generation":2,"error":"{expected}"}}')
    assert cluster.nodes.pending_resizes(NODE) == ["grower"]

    kubectl("delete", "pod", "other", "--wait=false")

    wait_until(
        lambda: actual_cpu(get_pod(cluster, namespace, "grower")) == "6",
        timeout=GRACE_CAP + 5,
        what="the deferred resize to be actuated once the other pod is gone",
    )
    assert condition(get_pod(cluster, namespace, "grower"), "PodResizePending") is None


@pytest.mark.needs_kube(
    34,
    "the kubelet retries deferred resizes highest priority first (the allocation "
    "manager's queue of pending resizes; 1.33 retries each at its own pod's next sync)",
)
def test_deferred_resizes_are_retried_higher_priority_first(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    wait_until: Waiter,
) -> None:
    # 2 + 3 + 1 + 1 = 7 of 8 CPU used; each resize needs 2 more.
    apply(
        kubectl,
        pod("filler", "2"),
        pod("ballast", "3"),
        pod("low", "1", priority_class=priority_classes["low"]),
        pod("high", "1", priority_class=priority_classes["high"]),
    )
    kubectl("wait", "--for=condition=Ready", "pod", "--all", "--timeout=20s")
    assert resize(kubectl, "low", "3").returncode == 0
    assert resize(kubectl, "high", "3").returncode == 0
    for name in ("low", "high"):
        wait_until(
            lambda n=name: condition(get_pod(cluster, namespace, n), "PodResizePending"),
            what=f"{name} to be deferred",
        )

    # Frees 2 CPU: room for exactly one of them. The kubelet takes the higher priority.
    kubectl("delete", "pod", "filler", "--wait=false")

    wait_until(
        lambda: actual_cpu(get_pod(cluster, namespace, "high")) == "3",
        timeout=GRACE_CAP + 5,
        what="high to be resized",
    )
    low = get_pod(cluster, namespace, "low")
    assert actual_cpu(low) == "1"
    pending = condition(low, "PodResizePending")
    assert pending is not None and pending["reason"] == "Deferred"
    assert pending["message"] == (
        "Node didn't have enough resource: cpu, requested: 3000, used: 6000, capacity: 8000"
    )


def test_a_deleted_pod_is_finalized_after_its_grace_period(
    cluster: Cluster, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    apply(kubectl, pod("leaving", "1", grace=30))
    kubectl("wait", "--for=condition=Ready", "pod/leaving", "--timeout=20s")

    began = time.monotonic()
    kubectl("delete", "pod", "leaving", "--wait=false")

    terminating = get_pod(cluster, namespace, "leaving")
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30

    def gone() -> bool:
        try:
            get_pod(cluster, namespace, "leaving")
        except Exception as e:
            return getattr(e, "status", None) == 404
        return False

    wait_until(gone, timeout=GRACE_CAP + 5, what="the pod to be removed")
    elapsed = time.monotonic() - began
    # Removed by the kubelet after the (capped) grace period, not before.
    assert GRACE_CAP - 0.3 <= elapsed <= GRACE_CAP + 3


def test_the_eviction_api_refuses_a_pod_protected_by_a_pdb(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    core_v1: k8s.CoreV1Api,
    policy_v1: k8s.PolicyV1Api,
    wait_until: Waiter,
) -> None:
    apply(
        kubectl,
        pod("guarded", "1", labels={"app": "guarded"}),
        pod("unguarded", "1", labels={"app": "free"}),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    kubectl("wait", "--for=condition=Ready", "pod/guarded", "pod/unguarded", "--timeout=20s")
    # The Eviction API ignores a budget for a Pending pod (canIgnorePDB), and the hollow
    # kubelet's first status may say Ready while the pod is still Pending.
    wait_running(kubectl, "pod/guarded", "pod/unguarded")

    # The disruption controller in kube-controller-manager computes the PDB's status.
    def computed() -> k8s.V1PodDisruptionBudget | None:
        pdb = policy_v1.read_namespaced_pod_disruption_budget("guard", namespace)
        status = pdb.status
        if status is None or status.observed_generation != pdb.metadata.generation:
            return None
        return pdb if status.current_healthy == 1 else None

    pdb = wait_until(computed, timeout=30, what="the disruption controller to compute the PDB")
    assert pdb.status.desired_healthy == 1
    assert pdb.status.expected_pods == 1
    assert pdb.status.disruptions_allowed == 0

    eviction = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name="guarded", namespace=namespace))
    with pytest.raises(ApiException) as refused:
        core_v1.create_namespaced_pod_eviction("guarded", namespace, eviction)
    assert refused.value.status == 429
    assert "disruption budget" in json.loads(refused.value.body)["message"]
    assert get_pod(cluster, namespace, "guarded")["metadata"].get("deletionTimestamp") is None

    # Without a PDB the same call evicts: DisruptionTarget, then the kubelet finalizes it.
    core_v1.create_namespaced_pod_eviction(
        "unguarded", namespace, k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name="unguarded"))
    )
    evicted = get_pod(cluster, namespace, "unguarded")
    target = condition(evicted, "DisruptionTarget")
    assert target is not None and target["reason"] == "EvictionByEvictionAPI"
    wait_until(
        lambda: "unguarded" not in kubectl("get", "pods", "-o", "name").stdout,
        timeout=GRACE_CAP + 5,
        what="the evicted pod to be removed",
    )


@pytest.mark.needs_kube(36, RESIZE_VALIDATOR)
def test_a_resize_beyond_node_allocatable_is_rejected_by_the_api_server(
    cluster: Cluster, namespace: str, kubectl: Kubectl
) -> None:
    apply(kubectl, pod("huge", "4"))
    kubectl("wait", "--for=condition=Ready", "pod/huge", "--timeout=20s")

    result = resize(kubectl, "huge", "9")

    assert result.returncode != 0
    assert "Forbidden" in result.stderr
    assert (
        "node didn't have enough allocatable resources: cpu, requested: 9000, allocatable: 8000"
        in result.stderr
    )
    assert actual_cpu(get_pod(cluster, namespace, "huge")) == "4"


def test_kubectl_works_as_a_client_and_the_scheduler_places_pods(
    cluster: Cluster, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    version = json.loads(kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == cluster.binaries.version

    nodes = kubectl("get", "nodes", "--no-headers").stdout
    assert nodes.split()[:2] == [NODE, "Ready"]

    # No nodeName: kube-scheduler binds it, the kubelet runs it.
    apply(kubectl, pod("scheduled", "500m", node=None))
    kubectl("wait", "--for=condition=Ready", "pod/scheduled", "--timeout=30s")
    # The hollow kubelet's first status of a pod may say Ready before it says Running
    # with an IP (harness/node; see run_pods in tests/e2e/service_support.py).
    placed = wait_until(
        lambda: (p := get_pod(cluster, namespace, "scheduled"))["status"].get("podIP") and p,
        what="the kubelet to report the pod's IP",
    )
    assert placed["spec"]["nodeName"] == NODE
    row = kubectl("get", "pod", "scheduled", "--no-headers").stdout.split()
    assert row[:3] == ["scheduled", "1/1", "Running"]
    described = kubectl("describe", "node", NODE).stdout
    assert f"{namespace}" in described and "500m (6%)" in described


def test_the_node_opt_out_field_is_dropped_without_its_feature_gate(cluster: Cluster) -> None:
    # v1.37 only keeps spec.podPreemptionPolicy with InPlacePodVerticalScalingSchedulerPreemption
    # on (off by default).
    patched = cluster.client.patch(
        f"/api/v1/nodes/{NODE}",
        {"spec": {"podPreemptionPolicy": {"disableResizePreemption": ["example.com/tests"]}}},
    )
    assert "podPreemptionPolicy" not in patched["spec"]


def test_a_registered_webhook_is_called_for_pod_resizes(
    cluster: Cluster, namespace: str, kubectl: Kubectl, tmp_path: Any, wait_until: Waiter
) -> None:
    stub = tmp_path / "stub_webhook.py"
    stub.write_text(STUB_WEBHOOK)
    apply(kubectl, pod("watched", "1"))
    kubectl("wait", "--for=condition=Ready", "pod/watched", "--timeout=20s")

    hook = start_webhook(
        cluster.client, cluster.kubeconfig, tmp_path, command=[sys.executable, str(stub)]
    )
    try:
        configuration = cluster.client.get(f"{CONFIGURATION_PATH}/{CONFIGURATION_NAME}")
        webhook = configuration["webhooks"][0]
        assert webhook["clientConfig"]["url"] == f"{hook.url}/validate-resize"
        assert webhook["rules"][0]["resources"] == ["pods/resize"]
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["sideEffects"] == "NoneOnDryRun"

        result = resize(kubectl, "watched", "2")
        assert result.returncode == 0, result.stderr
        assert "Warning: stub webhook saw UPDATE pods/resize of watched" in result.stderr
    finally:
        hook.stop()

    # Unregistered: resizes no longer reach it (the API server drops it within moments).
    wait_until(
        lambda: "stub webhook" not in resize(kubectl, "watched", "1").stderr,
        what="the webhook to be unregistered",
    )
