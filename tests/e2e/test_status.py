"""``python -m webhook status`` and ``plan --kubeconfig`` against the local control plane,
as a ServiceAccount holding only the viewer ClusterRole and Role of deploy/base/rbac.yaml:
what they report for a resize the kubelet Deferred, that they write nothing, and the one
line a user without the rights gets."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.kubeapi import ApiError
from harness.webhook_process import NAMESPACE, ensure_namespace
from tests.e2e.conftest import Cluster, Kubectl, StartService, Waiter
from tests.e2e.service_support import read_pod, resize, resize_patch, resize_pending
from tests.e2e.test_reconciler import disruptions_allowed, set_budget
from tests.e2e.test_service import walkthrough

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "base" / "rbac.yaml"
VIEWER = "resize-preemption-webhook-viewer"
SLOW = 40.0
NOW = "2030-01-01T00:00:00Z"


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def viewer_objects() -> list[dict[str, Any]]:
    """The viewer ClusterRole and Role as deploy/base ships them, the Role moved into the
    namespace the test service runs in."""
    found = [d for d in yaml.safe_load_all(RBAC.read_text()) if d["metadata"]["name"] == VIEWER]
    assert ["ClusterRole", "Role"] == sorted(d["kind"] for d in found)
    for d in found:
        if d["kind"] == "Role":
            d["metadata"]["namespace"] = NAMESPACE
    return found


def create(cluster: Cluster, path: str, body: dict[str, Any]) -> str | None:
    """Create ``body`` under ``path``; its path, or ``None`` when it was there already."""
    try:
        cluster.client.create(path, body)
    except ApiError as e:
        if e.status != 409:
            raise
        return None
    return f"{path}/{body['metadata']['name']}"


def token_kubeconfig(cluster: Cluster, kubectl: Kubectl, account: str, out: Path) -> Path:
    """A kubeconfig for the cluster that authenticates as ``account`` (a ServiceAccount of
    the test namespace) with a short-lived token."""
    token = kubectl("create", "token", account, "--duration=10m").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = admin["contexts"][0]["context"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [c for c in admin["clusters"] if c["name"] == context["cluster"]],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": account, "context": {"cluster": context["cluster"], "user": account}}
        ],
        "current-context": account,
    }
    out.write_text(yaml.safe_dump(config))
    return out


def may(kubectl: Kubectl, user: str, *args: str) -> bool:
    result = kubectl("auth", "can-i", *args, "--as", user, check=False)
    return result.stdout.strip() == "yes"


@pytest.fixture
def accounts(
    cluster: Cluster, namespace: str, kubectl: Kubectl, tmp_path: Path, wait_until: Waiter
) -> Iterator[Callable[[str], Path]]:
    """``accounts("viewer")``: a kubeconfig of a ServiceAccount bound to the viewer roles;
    ``accounts("outsider")``: of one bound to nothing."""
    ensure_namespace(cluster.client, NAMESPACE)
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    created = [
        create(cluster, f"{rbac}/clusterroles", role)
        if role["kind"] == "ClusterRole"
        else create(cluster, f"{rbac}/namespaces/{NAMESPACE}/roles", role)
        for role in viewer_objects()
    ]
    binding = f"{VIEWER}-{secrets.token_hex(3)}"
    subject = {"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "name": VIEWER}
    cluster_bindings = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    role_bindings = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings"
    for name in ("viewer", "outsider"):
        cluster.client.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}
        )
    cluster.client.create(
        cluster_bindings,
        {
            "metadata": {"name": binding},
            "roleRef": {**ref, "kind": "ClusterRole"},
            "subjects": [subject],
        },
    )
    cluster.client.create(
        role_bindings,
        {"metadata": {"name": binding}, "roleRef": {**ref, "kind": "Role"}, "subjects": [subject]},
    )
    user = f"system:serviceaccount:{namespace}:viewer"
    wait_until(
        lambda: (
            may(kubectl, user, "list", "nodes")
            and may(kubectl, user, "list", "leases", "-n", NAMESPACE)
        ),
        timeout=15,
        what="the viewer's bindings",
    )
    yield lambda account: token_kubeconfig(cluster, kubectl, account, tmp_path / account)
    cluster.client.delete(f"{cluster_bindings}/{binding}")
    cluster.client.delete(f"{role_bindings}/{binding}")
    for path in created:
        if path is not None:
            cluster.client.delete(path)


def leases(cluster: Cluster) -> dict[str, str]:
    """Name -> resourceVersion of every Lease in the service's namespace."""
    found = cluster.client.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in found["items"]}


@pytest.fixture
def blocked_deferred_resize(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    wait_until: Waiter,
) -> None:
    """The walkthrough's resize to 6 CPU, Deferred by the kubelet, its only useful victim
    kept by a PodDisruptionBudget: nothing may act on it, whatever runs."""
    walkthrough(kubectl, priority_classes)
    set_budget(cluster, namespace, 1)
    wait_until(lambda: disruptions_allowed(cluster, namespace) == 0, timeout=SLOW, what="PDB")
    resize(kubectl, "high-priority-pod", "6")
    wait_until(
        lambda: resize_pending(read_pod(cluster, namespace, "high-priority-pod")) == "Deferred",
        timeout=SLOW,
        what="the kubelet to defer",
    )


def test_a_viewer_sees_the_deferred_resize_why_it_waits_and_the_leader(
    cluster: Cluster,
    namespace: str,
    accounts: Callable[[str], Path],
    blocked_deferred_resize: None,
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    viewer = accounts("viewer")
    # The service's first pass and Lease renewals may write; status must not.
    wait_until(lambda: run_status(viewer)["leader"], timeout=SLOW, what="a leader")
    before = leases(cluster)

    data = run_status(viewer)

    mine = [w for w in data["deferred"] if w["pod"].startswith(f"{namespace}/")]
    assert [(f"{namespace}/high-priority-pod", "node-1", "infeasible", [])] == [
        (w["pod"], w["node"], w["reason"], w["victims"]) for w in mine
    ]
    assert "PodDisruptionBudget" in mine[0]["detail"]
    assert mine[0]["waitingSeconds"] >= 0
    assert data["leader"]["holder"] and not data["leader"]["expired"]
    assert read_pod(cluster, namespace, "low-priority-pod") is not None
    after = leases(cluster)
    ledger = {k: v for k, v in after.items() if k.startswith("rpw-ledger-")}
    assert ledger == {k: v for k, v in before.items() if k.startswith("rpw-ledger-")}


def run_status(kubeconfig: Path, *args: str) -> dict[str, Any]:
    result = run_cli(
        "status",
        "--kubeconfig",
        str(kubeconfig),
        "--service-namespace",
        NAMESPACE,
        "-o",
        "json",
        *args,
    )
    assert (0, "") == (result.returncode, result.stderr)
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def test_status_of_one_node_and_as_a_table(
    accounts: Callable[[str], Path], blocked_deferred_resize: None
) -> None:
    viewer = accounts("viewer")

    elsewhere = run_status(viewer, "--node", "no-such-node")
    table = run_cli("status", "--kubeconfig", str(viewer), "--service-namespace", NAMESPACE)

    assert ([], []) == (elsewhere["nodes"], elsewhere["deferred"])
    assert 0 == table.returncode, table.stderr
    assert "deferred resizes:" in table.stdout
    assert "high-priority-pod" in table.stdout


def test_plan_against_the_live_cluster_is_the_plan_of_its_snapshot(
    namespace: str,
    kubectl: Kubectl,
    accounts: Callable[[str], Path],
    blocked_deferred_resize: None,
) -> None:
    viewer = accounts("viewer")
    pod = f"{namespace}/high-priority-pod"
    common = ["--pod", pod, "--resize", resize_patch("7"), "--now", NOW, "-o", "json"]
    listed = kubectl("get", "nodes,pods,pdb,priorityclasses", "-A", "-o", "yaml").stdout

    live = run_cli("plan", "--kubeconfig", str(viewer), "--service-namespace", NAMESPACE, *common)
    offline = run_cli("plan", "--snapshot", "-", *common, stdin=listed)

    assert (0, "") == (live.returncode, live.stderr)
    assert (0, "") == (offline.returncode, offline.stderr)
    assert json.loads(offline.stdout) == json.loads(live.stdout)
    assert "infeasible" == json.loads(live.stdout)["verdict"]


def run_plugin(cluster: Cluster, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl resize-preemption args...`` with the real kubectl, the console script found
    on PATH beside this Python, the cluster that of ``$KUBECONFIG`` as for any plugin."""
    path = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))
    return subprocess.run(
        [str(cluster.binaries.kubectl), "resize-preemption", *args],
        env={**os.environ, "PATH": path, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_kubectl_plugin_tells_status_and_plans_as_the_commands_do(
    cluster: Cluster,
    namespace: str,
    accounts: Callable[[str], Path],
    blocked_deferred_resize: None,
) -> None:
    viewer = accounts("viewer")
    pod = f"{namespace}/high-priority-pod"
    common = ["--pod", pod, "--resize", resize_patch("7"), "--now", NOW, "-o", "json"]

    status = run_plugin(cluster, viewer, "status", "--service-namespace", NAMESPACE, "-o", "json")
    plan = run_plugin(cluster, viewer, "plan", "--service-namespace", NAMESPACE, *common)
    direct = run_cli("plan", "--kubeconfig", str(viewer), "--service-namespace", NAMESPACE, *common)

    assert (0, "") == (status.returncode, status.stderr)
    assert (0, "") == (plan.returncode, plan.stderr)
    mine = [w for w in json.loads(status.stdout)["deferred"] if w["pod"] == pod]
    assert [("infeasible", "node-1")] == [(w["reason"], w["node"]) for w in mine]
    assert json.loads(direct.stdout) == json.loads(plan.stdout)


def test_without_the_viewer_rights_one_line_and_exit_4(
    accounts: Callable[[str], Path], namespace: str
) -> None:
    outsider = accounts("outsider")

    status = run_cli("status", "--kubeconfig", str(outsider), "--service-namespace", NAMESPACE)
    plan = run_cli(
        "plan",
        "--kubeconfig",
        str(outsider),
        "--pod",
        f"{namespace}/anything",
        "--resize",
        resize_patch("2"),
    )

    for result in (status, plan):
        assert (4, 1, "") == (result.returncode, len(result.stderr.splitlines()), result.stdout)
        assert "forbidden" in result.stderr and VIEWER in result.stderr, result.stderr


def test_a_pod_that_is_not_there_is_one_line_and_exit_2(
    accounts: Callable[[str], Path], namespace: str
) -> None:
    viewer = accounts("viewer")

    result = run_cli(
        "plan",
        "--kubeconfig",
        str(viewer),
        "--pod",
        f"{namespace}/gone",
        "--resize",
        resize_patch("2"),
    )

    assert (2, f"error: no pod {namespace}/gone in the cluster\n") == (
        result.returncode,
        result.stderr,
    )
