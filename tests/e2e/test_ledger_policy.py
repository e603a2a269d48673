"""The chart's admission policy on the Leases of the service's namespace (its ledger and its
leader election), on the real API server: only the service's account creates or changes
one, a cluster administrator included in "anyone else"; deleting stays open. Rendered by
helm, applied for real into a namespace of this module's own, and tried by the cluster's
admin and by a token of the service's account."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster, Kubectl
from tests.e2e.helm_tools import render
from tests.e2e.service_support import account_kubeconfig

pytestmark = pytest.mark.e2e

REFUSAL = "only the resize-preemption-webhook service writes the Leases of its namespace"


def lease(name: str, holder: str = "someone") -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "annotations": {"resize-preemption.io/ledger": "[]"}},
        "spec": {"holderIdentity": holder},
    }


@pytest.fixture(scope="module")
def callers(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """{"admin": Kubectl, "service": Kubectl} in the service's namespace, the policy in
    force and the service's account granted Lease writes there."""
    suffix = secrets.token_hex(3)
    service_ns = release = f"rpw-lp-{suffix}"
    policy = [
        d
        for d in render({}, release=release, namespace=service_ns)
        if d["kind"].startswith("ValidatingAdmissionPolicy")
        and d["metadata"]["name"].endswith("-leases")
    ]
    assert 2 == len(policy)
    account = policy[0]["metadata"]["name"].removesuffix("-leases")
    rights = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": service_ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": service_ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "leases", "namespace": service_ns},
         "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": ["get", "create", "update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "leases", "namespace": service_ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leases"},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": service_ns}]},
    ]  # fmt: skip
    text = yaml.safe_dump_all([*rights, *policy])
    root = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig)
    root("apply", "-f", "-", input=text)
    config = account_kubeconfig(cluster, service_ns, account, tmp_path_factory.mktemp("leases"))
    admin = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig, service_ns)
    _wait_in_force(admin)
    try:
        yield {"admin": admin, "service": Kubectl(cluster.binaries.kubectl, config, service_ns)}
    finally:
        root("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=text, check=False)


def _wait_in_force(admin: Kubectl) -> None:
    """The policy is served a moment after it is created: wait until it refuses."""
    deadline = time.monotonic() + 30
    for attempt in range(1_000_000):
        probe = yaml.safe_dump(lease(f"probe-{attempt}"))
        created = admin("create", "-f", "-", input=probe, check=False)
        if REFUSAL in created.stderr:
            return
        admin("delete", "lease", f"probe-{attempt}", check=False)
        assert time.monotonic() < deadline, created.stdout + created.stderr
        time.sleep(0.3)


def test_the_service_writes_its_leases(callers: dict[str, Any]) -> None:
    service = callers["service"]

    created = service("create", "-f", "-", input=yaml.safe_dump(lease("ledger-a")), check=False)
    changed = service("annotate", "lease", "ledger-a", "x=1", check=False)

    assert (0, 0) == (created.returncode, changed.returncode), created.stderr + changed.stderr


def test_nobody_else_writes_them_and_anyone_with_the_right_may_delete_them(
    callers: dict[str, Any],
) -> None:
    admin, service = callers["admin"], callers["service"]
    service("create", "-f", "-", input=yaml.safe_dump(lease("ledger-b")))

    created = admin("create", "-f", "-", input=yaml.safe_dump(lease("ledger-c")), check=False)
    planted = admin(
        "annotate", "--overwrite", "lease", "ledger-b", "resize-preemption.io/ledger=[{}]",
        check=False,
    )  # fmt: skip
    deleted = admin("delete", "lease", "ledger-b", check=False)

    assert REFUSAL in created.stderr and REFUSAL in planted.stderr, created.stderr
    assert 0 == deleted.returncode, deleted.stderr
