"""Lending end to end: the service with lending on, resizes made with kubectl, the kubelet
actuating them. A pod annotated with a floor gives up CPU in place instead of being
evicted, keeps running, and gets its CPU back when the room returns."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import (
    NO_MEMORY_LIMIT_DECREASE,
    NODE,
    Cluster,
    Kubectl,
    StartService,
    Waiter,
    resize_retry_delay,
)
from tests.e2e.service_support import (
    actual_cpu,
    as_warning,
    events,
    kubectl_warnings,
    pod_manifest,
    read_pod,
    resize,
    run_pods,
    sample,
    scrape,
    spec_cpu,
    terminating,
)
from webhook.core.model import FLOOR_ANNOTATION
from webhook.core.resources import format_memory, memory_bytes

pytestmark = pytest.mark.e2e


def floor(cpu: str, container: str = "app") -> dict[str, str]:
    return {FLOOR_ANNOTATION: json.dumps({container: {"cpu": cpu}})}


def restarts(pod: dict[str, Any] | None) -> int:
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def at(cluster: Cluster, namespace: str, name: str, cpu: str) -> Callable[[], Any]:
    """A wait condition: ``name`` asks for and runs at ``cpu``."""

    def check() -> Any:
        pod = read_pod(cluster, namespace, name)
        return pod if pod and spec_cpu(pod) == cpu and actual_cpu(pod) == cpu else None

    return check


@pytest.mark.service_modes
def test_walkthrough_with_a_floor_lends_instead_of_evicting_and_gets_it_back(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    run_pods(
        kubectl,
        [
            pod_manifest(
                "low-priority-pod",
                "3",
                priority_classes["low"],
                memory="500Mi",
                annotations=floor("1"),
            ),
            pod_manifest("high-priority-pod", "4", priority_classes["high"], memory="1Gi"),
        ],
    )
    low_before = read_pod(cluster, namespace, "low-priority-pod")
    assert low_before is not None

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"borrowing cpu 1 from 1 lower-priority pod on {NODE}: "
            f"{namespace}/low-priority-pod (cpu 3->2)"
        )
    ] == kubectl_warnings(result)
    wait_until(
        at(cluster, namespace, "high-priority-pod", "6"),
        timeout=30,
        what="the resize to be actuated at 6 CPU",
    )
    low = wait_until(
        at(cluster, namespace, "low-priority-pod", "2"), timeout=30, what="the loan actuated"
    )
    assert (low_before["metadata"]["uid"], 0, False) == (
        low["metadata"]["uid"],
        restarts(low),
        terminating(low),
    )
    # Guaranteed: the limit went down with the request.
    assert "2" == low["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    high = read_pod(cluster, namespace, "high-priority-pod")
    assert high is not None
    assert [f"lent cpu 1 to pod {high['metadata']['uid']} on {NODE}"] == [
        e["message"] for e in events(kubectl, "low-priority-pod", "Lent")
    ]
    assert [] == events(kubectl, "low-priority-pod", "Preempted")

    back = resize(kubectl, "high-priority-pod", "4")

    assert 0 == back.returncode, back.stderr
    low = wait_until(
        at(cluster, namespace, "low-priority-pod", "3"), timeout=30, what="the loan given back"
    )
    assert (low_before["metadata"]["uid"], 0) == (low["metadata"]["uid"], restarts(low))


def walkthrough(
    kubectl: Kubectl, classes: dict[str, str], low_annotations: dict[str, str], **low: Any
) -> None:
    """The README's node (8 CPU): low-priority-pod 3 CPU with ``low_annotations``,
    high-priority-pod 4 CPU; 1 CPU free. ``low`` goes into low-priority-pod's spec."""
    manifest = pod_manifest(
        "low-priority-pod", "3", classes["low"], memory="500Mi", annotations=low_annotations
    )
    manifest["spec"]["containers"][0].update(low)
    run_pods(
        kubectl,
        [manifest, pod_manifest("high-priority-pod", "4", classes["high"], memory="1Gi")],
    )


@pytest.fixture
def lowest_class(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A PriorityClass below the fixture's ``low``, for a pod less important than a lender."""
    name = f"lowest-{namespace}"
    cluster.client.create(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": 10,
        },
    )
    yield name
    cluster.client.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def test_a_plan_with_one_eviction_and_one_loan(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    lowest_class: str,
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    # web 2 -> 6 CPU on 8 with 1 free: batch-1 at its floor (1) can stay, scratch cannot;
    # evicting scratch frees 2 and the last 1 is borrowed from batch-1.
    start_service()
    run_pods(
        kubectl,
        [
            pod_manifest("web", "2", priority_classes["high"]),
            pod_manifest("batch-1", "3", priority_classes["low"], annotations=floor("1")),
            pod_manifest("scratch", "2", lowest_class),
        ],
    )
    batch_uid = (read_pod(cluster, namespace, "batch-1") or {})["metadata"]["uid"]

    result = resize(kubectl, "web", "6")

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(f"preempting 1 lower-priority pod on {NODE} for cpu 6: {namespace}/scratch"),
        as_warning(
            f"borrowing cpu 1 from 1 lower-priority pod on {NODE}: {namespace}/batch-1 (cpu 3->2)"
        ),
    ] == kubectl_warnings(result)
    wait_until(at(cluster, namespace, "web", "6"), timeout=30, what="the resize actuated")
    batch = wait_until(at(cluster, namespace, "batch-1", "2"), timeout=30, what="the loan")
    assert (batch_uid, 0) == (batch["metadata"]["uid"], restarts(batch))
    wait_until(
        lambda: read_pod(cluster, namespace, "scratch") is None, timeout=30, what="scratch gone"
    )


def test_a_lender_whose_cpu_restarts_its_container_does_not_lend_it(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    walkthrough(
        kubectl,
        priority_classes,
        floor("1"),
        resizePolicy=[{"resourceName": "cpu", "restartPolicy": "RestartContainer"}],
    )

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"preempting 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
        )
    ] == kubectl_warnings(result)
    wait_until(at(cluster, namespace, "high-priority-pod", "6"), timeout=30, what="actuated")
    assert [] == events(kubectl, "low-priority-pod", "Lent")


def test_a_malformed_floor_is_an_ordinary_candidate_with_a_warning_event(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    walkthrough(kubectl, priority_classes, floor("1", container="web"))

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"preempting 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
        )
    ] == kubectl_warnings(result)
    wait_until(at(cluster, namespace, "high-priority-pod", "6"), timeout=30, what="actuated")
    [warning] = wait_until(
        lambda: events(kubectl, "low-priority-pod", "InvalidLendingFloor"),
        timeout=20,
        what="the floor's warning event",
    )
    assert ("Warning", True) == (warning["type"], "'web'" in warning["message"])


@pytest.mark.parametrize(
    ("serve_flags", "patch_flags"),
    [
        pytest.param((), ("--dry-run=server",), id="dry-run"),
        pytest.param(("--mode", "warn"), (), id="warn-mode"),
    ],
)
def test_dry_run_and_warn_say_what_they_would_borrow_and_change_nothing(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    serve_flags: tuple[str, ...],
    patch_flags: tuple[str, ...],
) -> None:
    start_service(*serve_flags)
    walkthrough(kubectl, priority_classes, floor("1"))

    result = resize(kubectl, "high-priority-pod", "6", *patch_flags)

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"would borrow cpu 1 from 1 lower-priority pod on {NODE}: "
            f"{namespace}/low-priority-pod (cpu 3->2)"
        )
    ] == kubectl_warnings(result)
    time.sleep(3)  # what the worker would have done by now
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert ("3", "3") == (spec_cpu(low or {}), actual_cpu(low))
    assert [] == events(kubectl, "low-priority-pod", "Lent")


@pytest.mark.service_modes
def test_a_restart_between_the_loan_and_the_give_back_neither_repeats_nor_forgets_it(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    first = start_service()
    walkthrough(kubectl, priority_classes, floor("1"))
    assert 0 == resize(kubectl, "high-priority-pod", "6").returncode
    wait_until(at(cluster, namespace, "high-priority-pod", "6"), timeout=30, what="actuated")
    wait_until(at(cluster, namespace, "low-priority-pod", "2"), timeout=30, what="the loan")

    first.stop()
    start_service()
    time.sleep(2)  # the new leader's first passes

    assert 1 == len(events(kubectl, "low-priority-pod", "Lent"))
    assert 0 == resize(kubectl, "high-priority-pod", "4").returncode
    low = wait_until(
        at(cluster, namespace, "low-priority-pod", "3"), timeout=30, what="the loan given back"
    )
    assert 0 == restarts(low)


def test_lending_switched_off_evicts_as_before(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service("--lending", "false")
    walkthrough(kubectl, priority_classes, floor("1"))

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"preempting 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
        )
    ] == kubectl_warnings(result)
    wait_until(at(cluster, namespace, "high-priority-pod", "6"), timeout=30, what="actuated")
    assert [] == events(kubectl, "low-priority-pod", "Lent")


#: Harness only: the memory the hollow node reports a pod using (docs/control-plane.md).
MEMORY_USAGE = "harness.resize-preemption.io/memory-usage"


def memory_of(pod: dict[str, Any] | None) -> tuple[int, int, int, int]:
    """The first container's memory: (request, limit, allocated, actuated request)."""
    if not pod:
        return (0, 0, 0, 0)
    resources = pod["spec"]["containers"][0]["resources"]
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    status = statuses[0]
    return (
        memory_bytes(resources.get("requests", {}).get("memory", "0")),
        memory_bytes(resources.get("limits", {}).get("memory", "0")),
        memory_bytes(status.get("allocatedResources", {}).get("memory", "0")),
        memory_bytes(status.get("resources", {}).get("requests", {}).get("memory", "0")),
    )


def refusal_scene(
    cluster: Cluster, namespace: str, kubectl: Kubectl, classes: dict[str, str], lowest: str
) -> tuple[dict[str, str], int, subprocess.CompletedProcess[str]]:
    """web 4Gi; batch-1 Guaranteed 6Gi (floor 2Gi, using 5Gi), the least important;
    batch-2 Burstable 4Gi (floor 1Gi, using 3Gi). web grows by 2Gi more than the node has
    free: the pods' uids, web's new size, and kubectl's answer."""
    batch_1 = pod_manifest("batch-1", "1", lowest, memory="6Gi")
    batch_1["metadata"]["annotations"] = {
        FLOOR_ANNOTATION: json.dumps({"app": {"memory": "2Gi"}}),
        MEMORY_USAGE: "5Gi",
    }
    batch_2 = pod_manifest("batch-2", "1", classes["low"], memory="4Gi")
    batch_2["metadata"]["annotations"] = {
        FLOOR_ANNOTATION: json.dumps({"app": {"memory": "1Gi"}}),
        MEMORY_USAGE: "3Gi",
    }
    batch_2["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1", "memory": "4Gi"},
        "limits": {"memory": "8Gi"},
    }
    run_pods(kubectl, [pod_manifest("web", "1", classes["high"], memory="4Gi"), batch_1, batch_2])
    uids = {
        n: (read_pod(cluster, namespace, n) or {})["metadata"]["uid"]
        for n in ("batch-1", "batch-2")
    }
    node = cluster.client.get(f"/api/v1/nodes/{NODE}")
    target = memory_bytes(node["status"]["allocatable"]["memory"]) - 8 * 1024**3
    memory = format_memory(target)
    patch = {"requests": {"memory": memory}, "limits": {"memory": memory}}
    result = kubectl(
        "patch",
        "pod",
        "web",
        "--subresource",
        "resize",
        "--patch",
        json.dumps({"spec": {"containers": [{"name": "app", "resources": patch}]}}),
        check=False,
    )
    return uids, target, result


def test_by_default_a_guaranteed_lenders_memory_is_not_lent(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    lowest_class: str,
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    # The same scene without lend-memory-limits: batch-1's limit is never lowered (a
    # process growing past it would be OOM-killed); batch-2 lends its request at once.
    gi = 1024**3
    start_service()
    uids, target, result = refusal_scene(
        cluster, namespace, kubectl, priority_classes, lowest_class
    )

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"borrowing memory 2Gi from 1 lower-priority pod on {NODE}: "
            f"{namespace}/batch-2 (memory 4Gi->2Gi)"
        )
    ] == kubectl_warnings(result)
    wait_until(
        lambda: memory_of(read_pod(cluster, namespace, "web")) == (target,) * 4,
        timeout=30 + resize_retry_delay(cluster.binaries),
        what="web's resize actuated",
    )
    batch_1 = read_pod(cluster, namespace, "batch-1")
    assert ((6 * gi,) * 4, uids["batch-1"], []) == (
        memory_of(batch_1),
        (batch_1 or {})["metadata"]["uid"],
        events(kubectl, "batch-1", "Lent") + events(kubectl, "batch-1", "LoanRefused"),
    )


#: Why a Guaranteed lender's memory cannot be lent before 1.34.


@pytest.mark.needs_kube(34, NO_MEMORY_LIMIT_DECREASE)
def test_a_loan_the_kubelet_refuses_is_put_back_and_the_room_borrowed_elsewhere(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    lowest_class: str,
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    # web grows by 2Gi more than the node has free. With lend-memory-limits on, batch-1
    # (Guaranteed, the least important) lends it first, down to 4Gi, but uses 5Gi: the
    # kubelet will not lower its memory limit below that. batch-2 (Burstable) lends
    # instead: only its request goes down, below what it uses, which the kubelet accepts.
    gi = 1024**3
    service = start_service("--lend-memory-limits", "true")
    before, target, result = refusal_scene(
        cluster, namespace, kubectl, priority_classes, lowest_class
    )

    assert 0 == result.returncode, result.stderr
    assert [
        as_warning(
            f"borrowing memory 2Gi from 1 lower-priority pod on {NODE}: "
            f"{namespace}/batch-1 (memory 6Gi->4Gi)"
        )
    ] == kubectl_warnings(result)
    wait_until(
        lambda: memory_of(read_pod(cluster, namespace, "web")) == (target,) * 4,
        timeout=30,
        what="web's resize actuated",
    )
    batch_1_now = wait_until(
        lambda: (lambda p: p if memory_of(p) == (6 * gi,) * 4 else None)(
            read_pod(cluster, namespace, "batch-1")
        ),
        # The kubelet reports the refusal at its next sync of the pod (10-15 s later).
        timeout=60,
        what="batch-1 back at its own spec, allocated and running",
    )
    batch_2_now = wait_until(
        lambda: (lambda p: p if memory_of(p)[3] == 2 * gi else None)(
            read_pod(cluster, namespace, "batch-2")
        ),
        timeout=30,
        what="batch-2's loan actuated",
    )
    # Burstable: the request went down below what the pod uses, its limit stayed.
    assert (2 * gi, 8 * gi, 2 * gi, 2 * gi) == memory_of(batch_2_now)
    assert (before["batch-1"], 0, before["batch-2"], 0) == (
        batch_1_now["metadata"]["uid"],
        restarts(batch_1_now),
        batch_2_now["metadata"]["uid"],
        restarts(batch_2_now),
    )
    [refused] = wait_until(
        lambda: events(kubectl, "batch-1", "LoanRefused"), timeout=10, what="the refusal told"
    )
    assert ("Warning", True) == (
        refused["type"],
        "cannot decrease memory limits" in refused["message"],
    )
    assert [] == events(kubectl, "batch-1", "Preempted") + events(kubectl, "batch-2", "Preempted")
    metrics = scrape(service.metrics_port)
    assert (1.0, 2.0) == (
        sample(metrics, "resize_preemption_loans_total", result="refused"),
        sample(metrics, "resize_preemption_loans_total", result="made"),
    )
