"""The service under its own account, end to end: the running service authenticates as the
ServiceAccount of deploy/base, holding exactly the base's rights (its ClusterRoles, Role
and bindings) and narrowed by the base's ValidatingAdmissionPolicy, and still makes room:
it evicts a victim, lends a lender's CPU in place, gives it back and removes the loan
record. tests/e2e/test_deploy.py shows what the account may not do; this shows that what
it may do is enough.

The base's objects are applied as built, renamed into a namespace and account of this
test's own so that nothing collides with another module's.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.replicas import ReplicaSet, start_replicas
from harness.webhook_process import unregister
from tests.e2e.conftest import NODE, Cluster, Kubectl, Waiter, victim_leaves
from tests.e2e.service_support import (
    account_kubeconfig,
    as_warning,
    kubectl_warnings,
    pod_manifest,
    read_pod,
    resize,
    run_pods,
)
from tests.e2e.test_lending import at, floor
from webhook.core.model import LOANS_ANNOTATION

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
KINDS = (
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)

Account = tuple[str, str, Path]  # (service namespace, account name, its kubeconfig)


@pytest.fixture(scope="module")
def account(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Account]:
    """The base's account, rights and admission policy, applied for real; a kubeconfig
    holding a token of that account. All removed afterwards."""
    admin = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig)
    built = admin("kustomize", str(REPO / "deploy" / "base")).stdout
    suffix = secrets.token_hex(3)
    namespace, name = f"rpw-lp-{suffix}", f"rpw-lp-{suffix}"
    objects = [d for d in yaml.safe_load_all(built) if d and d["kind"] in KINDS]
    text = yaml.safe_dump_all(objects).replace("resize-preemption-system", namespace)
    text = text.replace("resize-preemption-webhook", name)
    # The admission policy matches this account, and only it.
    assert f"'system:serviceaccount:{namespace}:{name}'" in text
    admin("apply", "-f", "-", input=text)
    kubeconfig = account_kubeconfig(cluster, namespace, name, tmp_path_factory.mktemp("account"))
    # The policy is served a moment after it is created: wait until it refuses the account
    # what RBAC alone allows (an annotation other than the loan record), so that what the
    # tests show holds under it.
    probe = pod_manifest(f"rpw-lp-probe-{suffix}", "100m", "")
    del probe["spec"]["priorityClassName"]
    admin("apply", "-n", "default", "-f", "-", input=yaml.safe_dump(probe))
    as_account = Kubectl(cluster.binaries.kubectl, kubeconfig, "default")
    deadline = time.monotonic() + 30
    for attempt in range(1_000_000):
        # A new value each time: an unchanged annotation is no change to refuse.
        refused = as_account(
            "annotate", "pod", probe["metadata"]["name"], f"x={attempt}", "--overwrite", check=False
        )
        if "ValidatingAdmissionPolicy" in refused.stderr:
            break
        assert time.monotonic() < deadline, refused.stdout + refused.stderr
        time.sleep(0.3)
    admin("delete", "-n", "default", "pod", probe["metadata"]["name"], "--wait=false")
    yield namespace, name, kubeconfig
    admin("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=text, check=False)


@pytest.fixture
def service(cluster: Cluster, account: Account) -> Iterator[Callable[..., ReplicaSet]]:
    started: list[ReplicaSet] = []

    def start(*flags: str) -> ReplicaSet:
        namespace, _, kubeconfig = account
        unregister(cluster.client)
        replica_set = start_replicas(
            cluster.client,
            kubeconfig,
            cluster.control_plane.state_dir,
            count=1,
            namespace=namespace,
            extra_args=flags,
        )
        started.append(replica_set)
        return replica_set

    yield start
    for replica_set in started:
        replica_set.stop()


def test_under_its_own_account_the_service_evicts(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Callable[..., ReplicaSet],
    wait_until: Waiter,
) -> None:
    service()
    run_pods(
        kubectl,
        [
            pod_manifest("low-priority-pod", "4", priority_classes["low"]),
            pod_manifest("high-priority-pod", "2", priority_classes["high"]),
        ],
    )

    result = resize(kubectl, "high-priority-pod", "6")

    assert [
        as_warning(
            f"preempting 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
        )
    ] == kubectl_warnings(result)
    wait_until(at(cluster, namespace, "high-priority-pod", "6"), timeout=40, what="the resize")
    victim_leaves(cluster, namespace, "low-priority-pod", wait_until)


def test_under_its_own_account_the_service_lends_gives_back_and_removes_the_record(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Callable[..., ReplicaSet],
    wait_until: Waiter,
) -> None:
    service()
    run_pods(
        kubectl,
        [
            pod_manifest("low-priority-pod", "3", priority_classes["low"], annotations=floor("1")),
            pod_manifest("high-priority-pod", "4", priority_classes["high"]),
        ],
    )

    result = resize(kubectl, "high-priority-pod", "6")

    assert 0 == result.returncode, result.stderr
    lent = wait_until(
        at(cluster, namespace, "low-priority-pod", "2"), timeout=40, what="the loan actuated"
    )
    # Lowered within its floor, through the resize subresource, its record written first.
    assert LOANS_ANNOTATION in lent["metadata"]["annotations"]
    wait_until(at(cluster, namespace, "high-priority-pod", "6"), timeout=40, what="the resize")

    assert 0 == resize(kubectl, "high-priority-pod", "4").returncode

    wait_until(
        at(cluster, namespace, "low-priority-pod", "3"), timeout=40, what="the loan given back"
    )

    def record_removed() -> bool:
        pod: dict[str, Any] | None = read_pod(cluster, namespace, "low-priority-pod")
        return pod is not None and LOANS_ANNOTATION not in pod["metadata"].get("annotations", {})

    wait_until(record_removed, timeout=40, what="the loan record removed")
