"""Lending end to end: the service with lending on, resizes made with kubectl, the kubelet
actuating them. A pod annotated with a floor gives up CPU in place instead of being
evicted, keeps running, and gets its CPU back when the room returns."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.webhook_process import WebhookProcess, start_webhook
from tests.e2e.conftest import NODE, Cluster, Kubectl, Waiter
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
    spec_cpu,
    terminating,
)
from webhook.core.model import FLOOR_ANNOTATION

pytestmark = pytest.mark.e2e

StartService = Callable[..., WebhookProcess]


@pytest.fixture
def start_service(cluster: Cluster, namespace: str) -> Iterator[StartService]:
    """``start_service(*serve_flags)``: the service with lending on (empty ledger),
    stopped and unregistered when the test ends."""
    started: list[WebhookProcess] = []
    clear_ledger(cluster)

    def start(*flags: str) -> WebhookProcess:
        process = start_webhook(
            cluster.client,
            cluster.kubeconfig,
            cluster.control_plane.state_dir,
            extra_args=("--lending", "true", *flags),
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    clear_ledger(cluster)


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
