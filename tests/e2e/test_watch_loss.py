"""The webhook loses its watches (issue 15 item 7): readiness says so past
``max-cache-staleness``, a review on such a cache fails open with a reason, and once the
watches are back readiness returns and the deferred resize is planned by the reconciler.

The watches are lost two ways: a relay between the service and kube-apiserver cuts every
connection and refuses new ones (the API server itself keeps serving, so reviews still
arrive), and kube-apiserver is killed and started again.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.replicas import RoundRobinFront
from harness.webhook_process import WebhookProcess, start_webhook
from tests.e2e.conftest import Cluster, Kubectl, Waiter
from tests.e2e.service_support import clear_ledger, pod_manifest, read_pod, resize, run_pods

pytestmark = pytest.mark.e2e

#: The bound the service runs with here (seconds; the default is 60).
BOUND = 3.0


def readiness(process: WebhookProcess) -> tuple[int, dict[str, Any]]:
    context = process.context()
    try:
        with urllib.request.urlopen(f"{process.url}/readyz", context=context, timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_for(condition: Any, timeout: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < timeout, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - began


def relayed_kubeconfig(cluster: Cluster, port: int, path: Path) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def relay(cluster: Cluster) -> Iterator[list[RoundRobinFront]]:
    """A TCP relay to kube-apiserver (a list: a test replaces it to reopen the port)."""
    fronts = [RoundRobinFront([cluster.control_plane.ports["apiserver"]]).start()]
    yield fronts
    fronts[-1].close()


@pytest.fixture
def service(
    cluster: Cluster, relay: list[RoundRobinFront], tmp_path: Path
) -> Iterator[WebhookProcess]:
    clear_ledger(cluster)
    kubeconfig = relayed_kubeconfig(cluster, relay[0].port, tmp_path / "kubeconfig")
    process = start_webhook(
        cluster.client,
        kubeconfig,
        tmp_path,
        extra_args=["--max-cache-staleness", str(BOUND), "--lease-duration", "3"],
    )
    yield process
    process.stop()
    clear_ledger(cluster)


def test_cut_watches_make_the_service_unready_past_the_bound_and_reviews_fail_open(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    relay: list[RoundRobinFront],
    service: WebhookProcess,
    wait_until: Waiter,
) -> None:
    run_pods(
        kubectl,
        [
            pod_manifest("low-priority-pod", "3", priority_classes["low"], memory="500Mi"),
            pod_manifest("high-priority-pod", "4", priority_classes["high"], memory="1Gi"),
        ],
    )
    assert 200 == readiness(service)[0]

    relay[0].close()  # every connection of the service to the API server, and new ones
    cut = time.monotonic()
    wait_for(lambda: readiness(service)[0] == 503, timeout=BOUND + 10)
    unready_after = time.monotonic() - cut
    status, body = readiness(service)
    # Connections close within a second of the cut (the relay's poll): the bound holds
    # from the moment the last watch ended.
    assert BOUND - 1.0 <= unready_after <= BOUND + 3.0, unready_after
    assert (503, False, True) == (status, body["checks"]["cache-current"], body["checks"]["tls"])

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    assert "cluster cache out of date" in result.stderr, result.stderr
    assert "resize allowed without a plan" in result.stderr, result.stderr
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is not None and not low["metadata"].get("deletionTimestamp"), low

    relay.append(RoundRobinFront([cluster.control_plane.ports["apiserver"]], relay[0].port))
    relay[-1].start()
    back = wait_for(lambda: readiness(service)[0] == 200, timeout=45)
    print(f"unready {unready_after:.1f}s after the cut; ready {back:.1f}s after the relay")

    # The kubelet deferred the resize; with its watches back the reconciler plans it.
    def actuated() -> bool:
        pod = read_pod(cluster, namespace, "high-priority-pod") or {}
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        return bool(statuses[0].get("resources", {}).get("requests", {}).get("cpu") == "6")

    wait_until(actuated, timeout=60, what="the deferred resize to be actuated")
    low = read_pod(cluster, namespace, "low-priority-pod")
    assert low is None or low["metadata"].get("deletionTimestamp"), low


def test_a_killed_kube_apiserver_makes_the_service_unready_past_the_bound_until_it_is_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    clear_ledger(cluster)
    process = start_webhook(
        cluster.client,
        cluster.kubeconfig,
        tmp_path,
        extra_args=["--max-cache-staleness", str(BOUND)],
    )
    try:
        assert 200 == readiness(process)[0]
        cluster.control_plane.kill_apiserver()
        killed = time.monotonic()
        try:
            wait_for(lambda: readiness(process)[0] == 503, timeout=BOUND + 10)
            unready_after = time.monotonic() - killed
        finally:
            cluster.control_plane.start_apiserver()
        started = time.monotonic()
        back = wait_for(lambda: readiness(process)[0] == 200, timeout=45)

        assert BOUND - 0.5 <= unready_after <= BOUND + 3.0, unready_after
        print(
            f"unready {unready_after:.1f}s after the kill; ready {back:.1f}s after the start"
            f" ({time.monotonic() - started:.1f}s)"
        )
    finally:
        process.stop()
        clear_ledger(cluster)
