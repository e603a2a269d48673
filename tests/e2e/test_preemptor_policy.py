"""Who may preempt, end to end: the running service (real ``python -m webhook serve``
replicas) refuses to take room for a pod outside the preemptor policy - through the webhook
and through the reconciler, which plans resizes the kubelet deferred with no review - and
never takes a ``kube-system`` pod unless told to.

kubectl makes every change; the (hollow) kubelet defers what does not fit. "Evicts
nobody" is read from the API server: the victim still runs, and the audit log holds no
eviction request for the namespace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster, Kubectl, Waiter
from tests.e2e.service_support import (
    decision_lines,
    entries_of,
    kubectl_warnings,
    ledger_entries,
    pod_manifest,
    read_pod,
    resize,
    run_pods,
    terminating,
)
from tests.e2e.test_reconciler import (
    SLOW,
    StartReplicas,
    deferred,
    evictions,
    replicas,
    resized_once_low_is_gone,
    walkthrough,
)

pytestmark = [pytest.mark.e2e, pytest.mark.service_modes]

__all__ = ["replicas"]  # the fixture, used by name

#: A reconciler pass runs every 5 s (and on every change): two and a bit of them.
PASSES = 12.0
MAY_PREEMPT = {"rpw-test": "may-preempt"}
SELECTOR = json.dumps({"matchLabels": MAY_PREEMPT})


def evicted_nobody(cluster: Cluster, namespace: str, victim: str = "low-priority-pod") -> None:
    pod = read_pod(cluster, namespace, victim)
    assert pod is not None and not terminating(pod), f"{victim} was removed"
    assert {} == evictions(cluster, namespace)


def refused_by_the_reconciler(log_path: Path, namespace: str, wait_until: Waiter) -> None:
    """The reconciler planned the deferred resize and refused it (not just never looked)."""

    def refused() -> bool:
        lines = decision_lines(log_path, namespace, "reconcile")
        return any(
            (line["verdict"], line["reason"]) == ("not-eligible", "preemptor-not-allowed")
            for line in lines
        )

    wait_until(refused, timeout=SLOW, what="the reconciler's refusal in the decision log")


def label_namespace(kubectl: Kubectl, namespace: str) -> None:
    kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in MAY_PREEMPT.items()))


# -- through the webhook ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "warning"),
    [
        (
            ("--min-preemptor-priority", "1000001"),
            "priority 1000000 under the preemptor policy's minimum 1000001; nobody preempted",
        ),
        (
            ("--preemptor-namespace-selector", SELECTOR),
            "namespace not selected by the preemptor policy; nobody preempted; cpu short by 3",
        ),
    ],
    ids=["below-the-minimum-priority", "namespace-not-selected"],
)
def test_a_review_outside_the_policy_evicts_nobody_and_says_why(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
    flags: tuple[str, ...],
    warning: str,
) -> None:
    service = replicas(*flags)
    walkthrough(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr  # allowed: the kubelet defers it
    (told,) = kubectl_warnings(result)
    assert told.startswith(f"resize will wait on node-1: {warning}"), told
    assert [] == entries_of(ledger_entries(cluster), namespace)  # nothing reserved
    wait_until(lambda: deferred(cluster, namespace), timeout=SLOW, what="the kubelet to defer")
    # The leader's reconciler sees the Deferred resize too, and holds it to the same rule.
    refused_by_the_reconciler(service.replicas[0].log_path, namespace, wait_until)
    time.sleep(PASSES)
    evicted_nobody(cluster, namespace)
    assert deferred(cluster, namespace)


# -- through the reconciler (no review) --------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [("--min-preemptor-priority", "1000001"), ("--preemptor-namespace-selector", SELECTOR)],
    ids=["below-the-minimum-priority", "namespace-not-selected"],
)
def test_a_deferred_resize_outside_the_policy_evicts_nobody(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
    flags: tuple[str, ...],
) -> None:
    service = replicas(*flags, register=False)  # leading, but the API server never calls it
    walkthrough(kubectl, priority_classes)

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode and [] == kubectl_warnings(result), result.stderr
    wait_until(lambda: deferred(cluster, namespace), timeout=SLOW, what="the kubelet to defer")
    refused_by_the_reconciler(service.replicas[0].log_path, namespace, wait_until)
    time.sleep(PASSES)
    evicted_nobody(cluster, namespace)
    assert [] == entries_of(ledger_entries(cluster), namespace)


def test_a_namespace_labelled_into_the_selector_is_preempted_for(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
) -> None:
    """The selector is what held it back: the same deferred resize, once its namespace
    carries the label, gets its room (the cache watches namespaces' labels)."""
    service = replicas("--preemptor-namespace-selector", SELECTOR, register=False)
    walkthrough(kubectl, priority_classes)
    resize(kubectl, "high-priority-pod", "6")
    wait_until(lambda: deferred(cluster, namespace), timeout=SLOW, what="the kubelet to defer")
    refused_by_the_reconciler(service.replicas[0].log_path, namespace, wait_until)
    evicted_nobody(cluster, namespace)

    label_namespace(kubectl, namespace)

    resized_once_low_is_gone(cluster, namespace, kubectl, wait_until)


# -- kube-system -------------------------------------------------------------------------------


@pytest.fixture
def system_pod(cluster: Cluster, priority_classes: dict[str, str]) -> Iterator[str]:
    """A low-priority pod of kube-system on node-1 (4 CPUs); removed afterwards."""
    system = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig, "kube-system")
    name = f"rpw-test-system-{int(time.time() * 1000) % 1_000_000}"
    run_pods(system, [pod_manifest(name, "4", priority_classes["low"])])
    yield name
    system("delete", "pod", name, "--ignore-not-found", "--grace-period=0", "--force", check=False)


@pytest.mark.parametrize(
    ("flags", "taken"),
    [((), False), (("--unprotected-namespaces", "kube-system"), True)],
    ids=["never-by-default", "once-opted-in"],
)
def test_a_kube_system_pod_is_never_a_victim_by_default(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: StartReplicas,
    wait_until: Waiter,
    system_pod: str,
    flags: tuple[str, ...],
    taken: bool,
) -> None:
    """node-1, 8 CPUs: kube-system's pod 4 (low priority, the only lower-priority pod),
    high-priority-pod 2 (to grow to 6), steady 1 (as important as high)."""
    replicas(*flags)
    run_pods(
        kubectl,
        [
            pod_manifest("high-priority-pod", "2", priority_classes["high"]),
            pod_manifest("steady", "1", priority_classes["high"]),
        ],
    )

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    (told,) = kubectl_warnings(result)
    system = f"kube-system/{system_pod}"
    if taken:
        assert told.endswith(system), told
        wait_until(
            lambda: read_pod(cluster, "kube-system", system_pod) is None,
            timeout=SLOW,
            what="the opted-in kube-system pod to go",
        )
        return
    assert told.startswith("cannot fit on node-1 even after preempting"), told
    wait_until(lambda: deferred(cluster, namespace), timeout=SLOW, what="the kubelet to defer")
    time.sleep(PASSES)
    pod = read_pod(cluster, "kube-system", system_pod)
    assert pod is not None and not terminating(pod)
    assert system_pod not in evictions(cluster, "kube-system")
