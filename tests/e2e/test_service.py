"""The webhook service end to end: the real ``python -m webhook serve`` process registered
with the real kube-apiserver, resizes made with the real kubectl, the (hollow) v1.37.2
kubelet actuating (or deferring) them.

Each test starts its own service process (so each reads a fresh log and fresh metrics)
with an empty ledger, and stops it, unregistered, before the next test.
"""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.kubeapi import ApiError
from harness.webhook_process import (
    CONFIGURATION_NAME,
    CONFIGURATION_PATH,
    NAMESPACE,
    WEBHOOK_NAME,
    WebhookProcess,
)
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter, victim_leaves
from tests.e2e.service_support import (
    actual_cpu,
    as_warning,
    audit_annotations,
    decision_lines,
    entries_of,
    events,
    kubectl_warnings,
    ledger_entries,
    pod_manifest,
    read_pod,
    resize,
    resize_pending,
    run_pods,
    sample,
    scrape,
    spec_cpu,
    terminating,
    webhook_audit,
)

pytestmark = pytest.mark.e2e

MUTATING_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
MUTATING_NAME = "mutate-resize.resize-preemption.io"
FIT_TO_NODE = "resize-preemption.io/fit-to-node"


def service_log(cluster: Cluster) -> Path:
    return cluster.control_plane.state_dir / "logs" / "webhook.log"


def audit_log(cluster: Cluster) -> Path:
    return cluster.control_plane.log_dir / "audit.log"


# -- scenes on node-1 (8 CPU) -------------------------------------------------------------


def walkthrough(kubectl: Kubectl, classes: dict[str, str], **high: Any) -> None:
    """The README's node: low-priority-pod 3 CPU, high-priority-pod 4 CPU; 1 CPU free."""
    run_pods(
        kubectl,
        [
            pod_manifest("low-priority-pod", "3", classes["low"], memory="500Mi"),
            pod_manifest("high-priority-pod", "4", classes["high"], memory="1Gi", **high),
        ],
    )


def crowded(kubectl: Kubectl, classes: dict[str, str], **high: Any) -> None:
    """high-priority-pod 2 CPU, steady 4 CPU (as important), low-priority-pod 1 CPU.

    Growing high-priority-pod to 5 CPU cannot fit even without low-priority-pod (5 + 4 > 8);
    to 4 CPU it fits once low-priority-pod is gone.
    """
    run_pods(
        kubectl,
        [
            pod_manifest("high-priority-pod", "2", classes["high"], **high),
            pod_manifest("steady", "4", classes["high"]),
            pod_manifest("low-priority-pod", "1", classes["low"]),
        ],
    )


# -- 1. the walkthrough ---------------------------------------------------------------------


def expect_preempted_and_actuated(
    cluster: Cluster,
    namespace: str,
    result: subprocess.CompletedProcess[str],
    wait_until: Waiter,
    *,
    cpu: str,
    first_warnings: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The admitted path end to end: the patch succeeds with the warning naming
    low-priority-pod (after ``first_warnings``), the kubelet actuates ``cpu`` on
    high-priority-pod, and the victim is gone. Returns the actuated pod."""
    assert 0 == result.returncode, result.stderr
    assert [
        *first_warnings,
        as_warning(
            f"preempting 1 lower-priority pod on {NODE} for cpu {cpu}: {namespace}/low-priority-pod"
        ),
    ] == kubectl_warnings(result)
    high: dict[str, Any] = wait_until(
        lambda: (
            (p := read_pod(cluster, namespace, "high-priority-pod")) and actual_cpu(p) == cpu and p
        ),
        timeout=30,
        what=f"the resize to be actuated at {cpu} CPU",
    )
    victim_leaves(cluster, namespace, "low-priority-pod", wait_until)
    return high


@pytest.mark.service_modes
def test_walkthrough_preempts_the_low_priority_pod_and_the_resize_is_actuated(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    walkthrough(kubectl, priority_classes)
    high = read_pod(cluster, namespace, "high-priority-pod")
    assert high is not None

    result = resize(kubectl, "high-priority-pod", "6")

    expect_preempted_and_actuated(cluster, namespace, result, wait_until, cpu="6")
    preempted = events(kubectl, "low-priority-pod", "Preempted")
    assert [f"Preempted by pod {high['metadata']['uid']} on node {NODE}"] == [
        e["message"] for e in preempted
    ]

    [decision] = wait_until(
        lambda: decision_lines(service_log(cluster), namespace), what="the decision-log line"
    )
    assert {
        "endpoint": "validate",
        "pod": f"{namespace}/high-priority-pod",
        "verdict": "preempt",
        "allowed": True,
        "mode": "enforce",
        "node": NODE,
        "reason": "preempt",
        "victims": [f"{namespace}/low-priority-pod"],
        "reserved": True,
        "dryRun": False,
        "requested": {"cpu": "6", "memory": "1Gi"},
    } == {k: v for k, v in decision.items() if k not in ("uid", "latencyMs", "headroom")}

    [annotations] = wait_until(
        lambda: audit_annotations(audit_log(cluster), namespace, "high-priority-pod"),
        timeout=20,
        what="the resize's audit event",
    )
    assert {
        "verdict": "preempt",
        "reason": "preempt",
        "node": NODE,
        "victims": f"{namespace}/low-priority-pod",
        "shortfall": "cpu=1,memory=0",
    } == webhook_audit(annotations)


@pytest.mark.service_modes
def test_two_worker_processes_preempt_once_and_count_into_one_view(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    service = start_service("--workers", "2")
    walkthrough(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "6")

    expect_preempted_and_actuated(cluster, namespace, result, wait_until, cpu="6")
    assert 1 == len(events(kubectl, "low-priority-pod", "Preempted"))

    def counted() -> float | None:
        # Reviews are counted right after they are answered, off the review path.
        return sample(
            scrape(service.metrics_port),
            "resize_preemption_reviews_total",
            endpoint="validate",
            verdict="preempt",
        )

    wait_until(counted, what="the review to be counted")
    metrics = scrape(service.metrics_port)
    assert 1.0 == sample(
        metrics, "resize_preemption_reviews_total", endpoint="validate", verdict="preempt"
    )
    # The two processes elect one leader between them; the master shows the replica's.
    assert 1.0 == sample(metrics, "resize_preemption_leader_election_master_status")


# -- 2. infeasible ---------------------------------------------------------------------------

INFEASIBLE = f"cannot fit on {NODE} even after preempting every lower-priority pod: cpu short by 1"


def test_an_infeasible_resize_evicts_nobody_and_says_why(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    crowded(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "5")

    assert 0 == result.returncode, result.stderr
    assert [INFEASIBLE] == kubectl_warnings(result)
    assert [] == entries_of(ledger_entries(cluster), namespace)
    high = wait_until(
        lambda: (
            (p := read_pod(cluster, namespace, "high-priority-pod")) and resize_pending(p) and p
        ),
        timeout=20,
        what="the kubelet to defer the resize",
    )
    assert "Deferred" == resize_pending(high)
    assert "5" == spec_cpu(high)
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not terminating(low)
    assert [] == events(kubectl, "low-priority-pod", "Preempted")


def test_a_resize_beyond_the_node_evicts_nobody_whichever_component_refuses_it(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    """From 1.36 the API server's PodResizeValidator refuses a resize above the node's
    allocatable; before, it reaches the kubelet, which marks it Infeasible. Either way
    nobody is evicted and nothing is reserved."""
    start_service()
    walkthrough(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "9")

    if "PodResizeValidator" in cluster.binaries.admission_plugins:
        assert 0 != result.returncode
        assert (
            "node didn't have enough allocatable resources: cpu, requested: 9000, "
            "allocatable: 8000" in result.stderr
        ), result.stderr
        high = read_pod(cluster, namespace, "high-priority-pod")
        assert high is not None and "4" == spec_cpu(high)
    else:
        assert 0 == result.returncode, result.stderr
        assert [f"requests exceed {NODE} allocatable: cpu 9 > 8"] == kubectl_warnings(result)
        high = wait_until(
            lambda: (
                (p := read_pod(cluster, namespace, "high-priority-pod")) and resize_pending(p) and p
            ),
            timeout=30,
            what="the kubelet to mark the resize Infeasible",
        )
        assert ("Infeasible", "9", "4") == (resize_pending(high), spec_cpu(high), actual_cpu(high))
    assert [] == entries_of(ledger_entries(cluster), namespace)
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not terminating(low)
    assert [] == events(kubectl, "low-priority-pod", "Preempted")


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param((), id="patch"),
        pytest.param(("--dry-run=server",), id="server-dry-run"),
    ],
)
def test_deny_infeasible_mode_refuses_the_resize_with_the_reason(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    flags: tuple[str, ...],
) -> None:
    start_service("--mode", "deny-infeasible")
    crowded(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "5", *flags)

    assert 0 != result.returncode
    assert f"resize-preemption: {INFEASIBLE}" in result.stderr
    high = read_pod(cluster, namespace, "high-priority-pod")
    assert high is not None and "2" == spec_cpu(high)
    assert [] == entries_of(ledger_entries(cluster), namespace)
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not terminating(low)


def test_deny_infeasible_mode_still_preempts_for_a_resize_that_can_fit(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service("--mode", "deny-infeasible")
    crowded(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "4")

    expect_preempted_and_actuated(cluster, namespace, result, wait_until, cpu="4")


# -- 3. dry run --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("serve_flags", "patch_flags", "stored_cpu"),
    [
        pytest.param((), ("--dry-run=server",), "4", id="server-dry-run"),
        pytest.param(("--mode", "warn"), (), "6", id="warn-mode"),
    ],
)
def test_a_resize_only_told_about_preemption_evicts_nobody_and_reserves_nothing(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    serve_flags: tuple[str, ...],
    patch_flags: tuple[str, ...],
    stored_cpu: str,
    wait_until: Waiter,
) -> None:
    start_service(*serve_flags)
    walkthrough(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "6", *patch_flags)

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"would preempt 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
        )
    ] == kubectl_warnings(result)
    # The ledger write is part of answering the review: had there been one, it is stored.
    assert [] == entries_of(ledger_entries(cluster), namespace)
    [decision] = wait_until(
        lambda: decision_lines(service_log(cluster), namespace), what="the decision-log line"
    )
    assert (bool(patch_flags), False, "preempt") == (
        decision["dryRun"],
        decision["reserved"],
        decision["verdict"],
    )
    high = read_pod(cluster, namespace, "high-priority-pod")
    assert high is not None and stored_cpu == spec_cpu(high)
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not terminating(low)
    assert [] == events(kubectl, "low-priority-pod", "Preempted")


# -- 4. PodDisruptionBudgets -------------------------------------------------------------------


def protect(cluster: Cluster, namespace: str, app: str, wait_until: Waiter) -> None:
    """A PDB (minAvailable 1) over ``app``, once the disruption controller counted it."""
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    cluster.client.create(
        path,
        {
            "metadata": {"name": app},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        },
    )

    def counted() -> bool:
        status = cluster.client.get(f"{path}/{app}").get("status", {})
        return status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

    wait_until(counted, timeout=30, what="the disruption controller to count the PDB")


@pytest.mark.service_modes
def test_a_pdb_protected_victim_is_not_planned_and_the_resize_waits(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    walkthrough(kubectl, priority_classes)
    protect(cluster, namespace, "low-priority-pod", wait_until)

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    reason = (
        f"cannot fit on {NODE} without violating a PodDisruptionBudget of "
        f"{namespace}/low-priority-pod"
    )
    assert [as_warning(reason)] == kubectl_warnings(result)
    [decision] = wait_until(
        lambda: decision_lines(service_log(cluster), namespace), what="the decision-log line"
    )
    assert ("infeasible", "pdb-violation", [], False) == (
        decision["verdict"],
        decision["reason"],
        decision["victims"],
        decision["reserved"],
    )
    assert [] == entries_of(ledger_entries(cluster), namespace)
    high = wait_until(
        lambda: (
            (p := read_pod(cluster, namespace, "high-priority-pod")) and resize_pending(p) and p
        ),
        timeout=20,
        what="the kubelet to defer the resize",
    )
    assert ("Deferred", "4") == (resize_pending(high), actual_cpu(high))
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not terminating(low)


def test_in_best_effort_pdb_mode_the_eviction_api_refuses_and_the_victim_stays(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    service = start_service("--pdb-mode", "best-effort")
    walkthrough(kubectl, priority_classes)
    protect(cluster, namespace, "low-priority-pod", wait_until)

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"preempting 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
        )
    ] == kubectl_warnings(result)
    wait_until(
        lambda: sample(
            scrape(service.metrics_port), "resize_preemption_victims_total", result="blocked-by-pdb"
        ),
        timeout=30,
        what="the worker's eviction to be refused by the PDB",
    )
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not terminating(low)
    assert [] == events(kubectl, "low-priority-pod", "Preempted")
    # A 1.33 kubelet can take a few seconds more to mark the resize (seen in make matrix).
    high = wait_until(
        lambda: (
            (p := read_pod(cluster, namespace, "high-priority-pod")) and resize_pending(p) and p
        ),
        timeout=20,
        what="the kubelet to defer the resize",
    )
    assert ("Deferred", "4") == (resize_pending(high), actual_cpu(high))
    # The admitted resize keeps its reservation while the budget blocks the eviction.
    [entry] = entries_of(ledger_entries(cluster), namespace)
    assert ([], [f"{namespace}/low-priority-pod"]) == (
        entry["handled"],
        [f"{v['namespace']}/{v['name']}" for v in entry["victims"]],
    )
    assert 1.0 == sample(scrape(service.metrics_port), "resize_preemption_ledger_entries")


# -- 6. the service down ----------------------------------------------------------------------


def test_with_the_service_down_a_resize_behaves_as_without_the_webhook(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    service = start_service()
    service.process.stop()  # the configuration stays registered
    assert not service.process.running()
    cluster.client.get(f"{CONFIGURATION_PATH}/{CONFIGURATION_NAME}")
    walkthrough(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    assert [] == kubectl_warnings(result)
    high = wait_until(
        lambda: (
            (p := read_pod(cluster, namespace, "high-priority-pod")) and resize_pending(p) and p
        ),
        timeout=20,
        what="the kubelet to defer the resize",
    )
    assert ("Deferred", "6", "4") == (resize_pending(high), spec_cpu(high), actual_cpu(high))
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not terminating(low)
    assert [] == entries_of(ledger_entries(cluster), namespace)
    # The API server called the webhook, could not reach it and went on (failurePolicy Ignore).
    [annotations] = wait_until(
        lambda: audit_annotations(audit_log(cluster), namespace, "high-priority-pod"),
        timeout=20,
        what="the resize's audit event",
    )
    assert WEBHOOK_NAME == annotations.get(
        "failed-open.validating.webhook.admission.k8s.io/round_0_index_0"
    )


# -- 7. the mutating endpoint -----------------------------------------------------------------


@pytest.fixture
def mutating_registration(cluster: Cluster) -> Iterator[Callable[[WebhookProcess], None]]:
    """``register(service)``: the opt-in MutatingWebhookConfiguration of
    deploy/components/mutating, pointed at ``service``; removed when the test ends."""

    def register(service: WebhookProcess) -> None:
        cluster.client.create(
            MUTATING_PATH,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": CONFIGURATION_NAME},
                "webhooks": [
                    {
                        "name": MUTATING_NAME,
                        "admissionReviewVersions": ["v1"],
                        "clientConfig": {
                            "url": f"{service.url}/mutate-resize",
                            "caBundle": base64.b64encode(service.ca_pem).decode(),
                        },
                        "rules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["UPDATE"],
                                "resources": ["pods/resize"],
                                "scope": "Namespaced",
                            }
                        ],
                        "matchPolicy": "Equivalent",
                        "namespaceSelector": {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/metadata.name",
                                    "operator": "NotIn",
                                    "values": [NAMESPACE],
                                }
                            ]
                        },
                        "matchConditions": [
                            {
                                "name": "fit-to-node-opt-in",
                                "expression": (
                                    "has(object.metadata.annotations) && "
                                    f"'{FIT_TO_NODE}' in object.metadata.annotations && "
                                    f"object.metadata.annotations['{FIT_TO_NODE}'] == 'true'"
                                ),
                            }
                        ],
                        "reinvocationPolicy": "Never",
                        "sideEffects": "NoneOnDryRun",
                        "failurePolicy": "Ignore",
                        "timeoutSeconds": 5,
                    }
                ],
            },
        )
        time.sleep(0.5)  # let the API server's webhook informer load it

    yield register
    try:
        cluster.client.delete(f"{MUTATING_PATH}/{CONFIGURATION_NAME}")
    except ApiError as e:
        if e.status != 404:
            raise


@pytest.mark.service_modes
def test_the_mutating_endpoint_reduces_an_infeasible_resize_to_the_largest_fit(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    mutating_registration: Callable[[WebhookProcess], None],
    wait_until: Waiter,
) -> None:
    mutating_registration(start_service())
    crowded(kubectl, priority_classes, annotations={FIT_TO_NODE: "true"})

    result = resize(kubectl, "high-priority-pod", "5")

    high = expect_preempted_and_actuated(
        cluster,
        namespace,
        result,
        wait_until,
        cpu="4",
        first_warnings=(f"resize-preemption: resize reduced to fit {NODE}: app cpu 5 -> 4",),
    )
    resources = high["spec"]["containers"][0]["resources"]
    assert ({"cpu": "4", "memory": "256Mi"}, {"cpu": "4", "memory": "256Mi"}) == (
        resources["requests"],
        resources["limits"],
    )
    assert "Guaranteed" == high["status"]["qosClass"]


def test_a_pod_that_did_not_opt_in_is_not_reduced(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    mutating_registration: Callable[[WebhookProcess], None],
) -> None:
    mutating_registration(start_service())
    crowded(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "5")

    assert 0 == result.returncode, result.stderr
    assert [INFEASIBLE] == kubectl_warnings(result)
    high = read_pod(cluster, namespace, "high-priority-pod")
    assert high is not None and "5" == spec_cpu(high)


# -- 8. metrics -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu", "verdict"),
    [
        pytest.param("5", "fits", id="fits"),
        pytest.param("6", "preempt", id="preempt"),
    ],
)
def test_metrics_count_reviews_by_verdict(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
    cpu: str,
    verdict: str,
) -> None:
    service = start_service()
    walkthrough(kubectl, priority_classes)
    before = scrape(service.metrics_port)

    result = resize(kubectl, "high-priority-pod", cpu)

    assert 0 == result.returncode, result.stderr
    counted = "resize_preemption_reviews_total"

    def counted_since() -> float:
        # Reviews are counted right after they are answered, off the review path.
        after = scrape(service.metrics_port)
        return (sample(after, counted, endpoint="validate", verdict=verdict) or 0.0) - (
            sample(before, counted, endpoint="validate", verdict=verdict) or 0.0
        )

    wait_until(lambda: counted_since() >= 1.0, what="the review to be counted")
    after = scrape(service.metrics_port)
    assert 1.0 == counted_since()
    assert 1.0 == sample(
        after, "resize_preemption_review_duration_seconds_count", endpoint="validate"
    )
    # The admitted resize holds a reservation until the kubelet actuated it.
    wait_until(
        lambda: actual_cpu(read_pod(cluster, namespace, "high-priority-pod")) == cpu,
        timeout=30,
        what=f"the resize to be actuated at {cpu} CPU",
    )
    wait_until(
        lambda: sample(scrape(service.metrics_port), "resize_preemption_ledger_entries") == 0.0,
        timeout=30,
        what="the reservation to be released",
    )
