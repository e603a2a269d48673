"""deploy/ against the real local API server, with the real kubectl.

* ``kubectl kustomize`` builds the base, both overlays and the mutating component, and
  ``kubectl apply --dry-run=server`` accepts everything they produce (validation, defaulting,
  admission: PodSecurity, CEL match conditions). cert-manager's CRDs are not installed: that
  overlay's cert-manager objects are only built, the rest goes through the server.
* The RBAC objects are applied for real, and ``kubectl auth can-i --list --as`` the
  ServiceAccount shows exactly the expected rights, cluster-wide and in its namespace.
* ``python -m webhook certs --patch-webhooks`` sets the caBundle on live configurations.

The webhook configurations of deploy/ are never created for real: the session's own test
webhook may be registered under the same name.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.kubeapi import ApiError
from tests.e2e.conftest import NO_MEMORY_LIMIT_DECREASE, Cluster, Kubectl
from tests.unit.test_manifests import (
    EXPECTED_CLUSTER_PERMISSIONS,
    EXPECTED_DELETE_PERMISSIONS,
    EXPECTED_LENDING_PERMISSIONS,
    EXPECTED_NAMESPACE_PERMISSIONS,
    NAME,
    NAMESPACE,
    SERVICE_ACCOUNT,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RBAC_KINDS = (
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    # Lending's (rbac-lending.yaml).
    "ClusterRole",
    "ClusterRoleBinding",
    # The viewer's (python -m webhook status), bound to nobody.
    "ClusterRole",
    "Role",
)
CERT_MANAGER_GROUP = "cert-manager.io"
#: Impersonated to learn what every ServiceAccount of the namespace may do without bindings.
BASELINE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:rpw-deploy-test-baseline"

Permission = tuple[str, str, str]  # (resource, non-resource URL, verb)


# --- helpers ----------------------------------------------------------------------------


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def dump(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def group_of(obj: dict[str, Any]) -> str:
    api_version: str = obj["apiVersion"]
    return api_version.rpartition("/")[0]


def kubectl_name(obj: dict[str, Any]) -> str:
    """``kind.group/name``, as ``kubectl get -o name`` prints it."""
    group = group_of(obj)
    return f"{obj['kind'].lower()}{'.' + group if group else ''}/{obj['metadata']['name']}"


def build(admin: Kubectl, directory: Path) -> list[dict[str, Any]]:
    result = admin("kustomize", str(directory), check=False)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return documents(result.stdout)


def server_dry_run(
    admin: Kubectl, objects: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    result = admin("apply", "--dry-run=server", "-f", "-", input=dump(objects), check=False)
    assert result.returncode == 0, f"server dry run failed:\n{result.stderr}"
    applied = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(objects), result.stdout
    assert "PodSecurity" not in result.stderr, result.stderr
    return result


def with_mutating_component(overlay: Path) -> Path:
    """Enable the mutating component in a copied overlay (as docs/deploy.md says to)."""
    path = overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["components"] = ["../../components/mutating"]
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return overlay


def run_certs(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", "certs", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Kubectl:
    return Kubectl(cluster.binaries.kubectl, cluster.kubeconfig)


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/ copied, with the self-signed overlay's tls/ made by the certs command."""
    target = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, target, ignore=shutil.ignore_patterns("tls"))
    result = run_certs("--out", str(target / "overlays/self-signed/tls"), "--kustomize-patch")
    assert result.returncode == 0, result.stderr
    return target


@pytest.fixture(scope="module")
def base_objects(admin: Kubectl) -> list[dict[str, Any]]:
    return build(admin, DEPLOY / "base")


@pytest.fixture(scope="module")
def rbac(cluster: Cluster, admin: Kubectl, base_objects: list[dict[str, Any]]) -> Iterator[None]:
    """The Namespace, ServiceAccount, roles and bindings of the base, applied for real and
    removed afterwards (only what this module created)."""
    objects = [o for o in base_objects if o["kind"] in RBAC_KINDS]
    assert sorted(o["kind"] for o in objects) == sorted(RBAC_KINDS)
    existing = set(
        admin(
            "get", "-f", "-", "--ignore-not-found", "-o", "name", input=dump(objects)
        ).stdout.split()
    )
    admin("apply", "-f", "-", input=dump(objects))
    yield
    created = [o for o in objects if kubectl_name(o) not in existing]
    namespaced = [
        o for o in created if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")
    ]
    cluster_scoped = [o for o in created if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    for batch in (namespaced, cluster_scoped):
        if batch:
            admin("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=dump(batch))
    if any(o["kind"] == "Namespace" for o in created):
        _remove_namespace(cluster, NAMESPACE)


def _remove_namespace(cluster: Cluster, name: str) -> None:
    """Delete and finalize (no namespace controller runs in the local control plane)."""
    api = cluster.client
    try:
        api.delete(f"/api/v1/namespaces/{name}")
        namespace = api.get(f"/api/v1/namespaces/{name}")
        namespace["spec"]["finalizers"] = []
        api.replace(f"/api/v1/namespaces/{name}/finalize", namespace)
    except ApiError as e:
        if e.status != 404:
            raise


# --- kustomize build + server dry run ---------------------------------------------------


def test_base_passes_server_dry_run(
    admin: Kubectl, rbac: None, base_objects: list[dict[str, Any]]
) -> None:
    kinds = sorted(o["kind"] for o in base_objects)
    assert kinds == sorted(
        [
            *RBAC_KINDS,
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "ValidatingWebhookConfiguration",
            # lending's and the Leases'
            *["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2,
        ]
    )
    server_dry_run(admin, base_objects)


def test_base_with_the_mutating_component_passes_server_dry_run(
    admin: Kubectl, rbac: None, tmp_path: Path
) -> None:
    """The server compiles the CEL match condition of the mutating webhook."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "base", tmp_path)],
                "components": [os.path.relpath(DEPLOY / "components" / "mutating", tmp_path)],
            }
        )
    )
    objects = build(admin, tmp_path)
    assert {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} <= {
        o["kind"] for o in objects
    }
    server_dry_run(admin, objects)


@pytest.mark.parametrize("mutating", [False, True], ids=["validating", "with-mutating"])
def test_self_signed_overlay_passes_server_dry_run(
    admin: Kubectl, rbac: None, deploy_copy: Path, tmp_path: Path, mutating: bool
) -> None:
    overlay = tmp_path / "deploy"
    shutil.copytree(deploy_copy, overlay)
    directory = overlay / "overlays" / "self-signed"
    if mutating:
        with_mutating_component(directory)
    objects = build(admin, directory)

    ca = (directory / "tls" / "ca.crt").read_bytes()
    configs = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert len(configs) == (2 if mutating else 1)
    for config in configs:
        assert base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]) == ca
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "resize-preemption-webhook-tls"
    assert secret["type"] == "kubernetes.io/tls"
    assert (
        base64.b64decode(secret["data"]["tls.key"]) == (directory / "tls" / "tls.key").read_bytes()
    )
    server_dry_run(admin, objects)


@pytest.mark.parametrize("mutating", [False, True], ids=["validating", "with-mutating"])
def test_service_overlay_passes_server_dry_run(
    admin: Kubectl, rbac: None, deploy_copy: Path, tmp_path: Path, mutating: bool
) -> None:
    """The overlay of the service's own certificates: an empty Secret, no caBundle, the
    container told where its Secret is (tests/e2e/test_helm_chart.py: the chart's default)."""
    overlay = tmp_path / "deploy"
    shutil.copytree(deploy_copy, overlay)
    directory = overlay / "overlays" / "service"
    if mutating:
        with_mutating_component(directory)
    objects = build(admin, directory)
    configs = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert len(configs) == (2 if mutating else 1)
    assert [None] * len(configs) == [
        c["webhooks"][0]["clientConfig"].get("caBundle") for c in configs
    ]
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert ("resize-preemption-webhook-tls", "Opaque", None) == (
        secret["metadata"]["name"], secret["type"], secret.get("data"),
    )  # fmt: skip
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ["--tls-secret", "resize-preemption-webhook-tls"] == args[9:11]
    server_dry_run(admin, objects)


@pytest.mark.parametrize("mutating", [False, True], ids=["validating", "with-mutating"])
def test_cert_manager_overlay_builds_and_the_rest_passes_server_dry_run(
    admin: Kubectl, rbac: None, tmp_path: Path, mutating: bool
) -> None:
    overlay = tmp_path / "deploy"
    shutil.copytree(DEPLOY, overlay, ignore=shutil.ignore_patterns("tls"))
    directory = overlay / "overlays" / "cert-manager"
    if mutating:
        with_mutating_component(directory)
    objects = build(admin, directory)

    cert_manager = [o for o in objects if group_of(o) == CERT_MANAGER_GROUP]
    assert sorted(o["kind"] for o in cert_manager) == [
        "Certificate",
        "Certificate",
        "Issuer",
        "Issuer",
    ]
    configs = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert len(configs) == (2 if mutating else 1)
    for config in configs:
        assert config["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{NAME}"
        }
    # Without cert-manager's CRDs the API server does not know these kinds.
    unknown = admin("apply", "--dry-run=server", "-f", "-", input=dump(cert_manager), check=False)
    assert unknown.returncode != 0
    server_dry_run(admin, [o for o in objects if group_of(o) != CERT_MANAGER_GROUP])


@pytest.mark.parametrize(
    ("priority_class", "priority"),
    [(None, 0), ("system-cluster-critical", 2_000_000_000)],
    ids=["no-class-by-default", "class-an-operator-sets"],
)
def test_pod_template_passes_restricted_pod_security_and_takes_its_priority(
    admin: Kubectl,
    rbac: None,
    base_objects: list[dict[str, Any]],
    priority_class: str | None,
    priority: int,
) -> None:
    """PodSecurity enforces only on pods: create one from the template (dry run) in the
    namespace that enforces "restricted"; the Priority plugin resolves the class an
    operator sets, and none is set by default."""
    (deployment,) = [o for o in base_objects if o["kind"] == "Deployment"]
    template = copy.deepcopy(deployment["spec"]["template"])
    assert "priorityClassName" not in template["spec"]
    if priority_class is not None:
        template["spec"]["priorityClassName"] = priority_class
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rpw-deploy-test", "namespace": NAMESPACE, **template["metadata"]},
        "spec": template["spec"],
    }
    result = admin(
        "create", "--dry-run=server", "-o", "yaml", "-f", "-", input=dump([pod]), check=False
    )

    assert result.returncode == 0, result.stderr
    assert "PodSecurity" not in result.stderr
    created = yaml.safe_load(result.stdout)
    assert created["spec"].get("priority", 0) == priority


# --- the ServiceAccount's rights --------------------------------------------------------

_CAN_I_ROW = re.compile(
    r"^\s*(?:(?P<resource>[^\s\[]\S*)\s+)?\[(?P<urls>[^\]]*)\]\s+\[(?P<names>[^\]]*)\]"
    r"\s+\[(?P<verbs>[^\]]*)\]\s*$"
)


def parse_can_i_list(text: str) -> set[Permission]:
    """``kubectl auth can-i --list --no-headers`` rows as (resource, URL, verb) triples."""
    granted: set[Permission] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _CAN_I_ROW.match(line)
        assert match, f"cannot parse can-i row {line!r}"
        assert not match["names"].strip(), f"unexpected resourceNames in {line!r}"
        urls = match["urls"].split() or [""]
        for url in urls:
            for verb in match["verbs"].split():
                granted.add((match["resource"] or "", url, verb))
    return granted


def as_can_i(permissions: frozenset[tuple[str, str, str]]) -> set[Permission]:
    return {(r if not g else f"{r}.{g}", "", v) for g, r, v in permissions}


def can_i_list(admin: Kubectl, user: str, namespace: str) -> set[Permission]:
    result = admin("auth", "can-i", "--list", "--no-headers", "--as", user, "-n", namespace)
    return parse_can_i_list(result.stdout)


def granted_rights(admin: Kubectl, namespace: str, expected: set[Permission]) -> set[Permission]:
    """What the ServiceAccount may do beyond any ServiceAccount of its namespace. RBAC
    caches take a moment to see new bindings: poll until the expected set shows up."""
    deadline = time.monotonic() + 15
    while True:
        baseline = can_i_list(admin, BASELINE_ACCOUNT, namespace)
        actual = can_i_list(admin, SERVICE_ACCOUNT, namespace)
        assert baseline <= actual
        granted = actual - baseline
        if granted == expected or time.monotonic() > deadline:
            return granted
        time.sleep(0.2)


def test_parse_can_i_list() -> None:
    text = (
        "pods                        []          []   [get list watch delete]\n"
        "pods/eviction               []          []   [create]\n"
        "events.events.k8s.io        []          []   [create patch]\n"
        "                            [/api/*]    []   [get]\n"
        "                            [/healthz /livez]  []   [get]\n"
    )
    assert parse_can_i_list(text) == {
        ("pods", "", "get"), ("pods", "", "list"), ("pods", "", "watch"), ("pods", "", "delete"),
        ("pods/eviction", "", "create"),
        ("events.events.k8s.io", "", "create"), ("events.events.k8s.io", "", "patch"),
        ("", "/api/*", "get"), ("", "/healthz", "get"), ("", "/livez", "get"),
    }  # fmt: skip


#: The base's cluster-wide rights: lending is on by default, eviction method delete is not.
BASE_CLUSTER_PERMISSIONS = EXPECTED_CLUSTER_PERMISSIONS | EXPECTED_LENDING_PERMISSIONS


def test_service_account_has_exactly_the_cluster_wide_rights(admin: Kubectl, rbac: None) -> None:
    expected = as_can_i(BASE_CLUSTER_PERMISSIONS)
    assert granted_rights(admin, "default", expected) == expected


def test_service_account_has_exactly_the_lease_rights_in_its_namespace(
    admin: Kubectl, rbac: None
) -> None:
    expected = as_can_i(BASE_CLUSTER_PERMISSIONS | EXPECTED_NAMESPACE_PERMISSIONS)
    assert granted_rights(admin, NAMESPACE, expected) == expected


def test_baseline_holds_none_of_the_expected_rights(admin: Kubectl, rbac: None) -> None:
    """Every account has some rights (discovery, self reviews, ...); none of them may be one
    of the webhook's, or subtracting the baseline would hide it."""
    baseline = can_i_list(admin, BASELINE_ACCOUNT, NAMESPACE)
    expected = as_can_i(
        BASE_CLUSTER_PERMISSIONS | EXPECTED_DELETE_PERMISSIONS | EXPECTED_NAMESPACE_PERMISSIONS
    )
    assert not baseline & expected
    assert not any(resource.startswith(("pods", "leases")) for resource, _, _ in baseline)


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (("create", "pods", "--subresource=eviction", "-A"), True),
        # Eviction method delete's rights: only with components/eviction-delete.
        (("patch", "pods", "--subresource=status", "-A"), False),
        (("delete", "pods", "-A"), False),
        (("watch", "poddisruptionbudgets.policy", "-A"), True),
        (("watch", "namespaces"), True),
        (("patch", "namespaces"), False),
        (("list", "priorityclasses.scheduling.k8s.io"), True),
        (("create", "events.events.k8s.io", "-n", "default"), True),
        (("update", "leases.coordination.k8s.io", "-n", NAMESPACE), True),
        (("create", "leases.coordination.k8s.io", "-n", "default"), False),
        (("delete", "leases.coordination.k8s.io", "-n", NAMESPACE), False),
        (("patch", "leases.coordination.k8s.io", "-n", NAMESPACE), False),
        (("get", "secrets", "-n", NAMESPACE), False),
        (("update", "pods", "-A"), False),
        # Lending's: the loan record and the lender's resize (the admission policy narrows
        # both further: test_admission_policy_*).
        (("patch", "pods", "-A"), True),
        (("patch", "pods", "--subresource=resize", "-A"), True),
        (("create", "pods", "-A"), False),
        (("patch", "nodes"), False),
        (("create", "events", "-n", "default"), False),
        (("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io"), False),
        (("patch", "validatingadmissionpolicies.admissionregistration.k8s.io"), False),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v),
)
def test_can_i(admin: Kubectl, rbac: None, args: tuple[str, ...], allowed: bool) -> None:
    assert can_i(admin, args, allowed) == allowed


def can_i(admin: Kubectl, args: tuple[str, ...], expected: bool) -> bool:
    """``kubectl auth can-i args --as`` the service account, polled for up to 15 s until
    it says ``expected`` (RBAC caches take a moment to see a change)."""
    deadline = time.monotonic() + 15
    while True:
        result = admin("auth", "can-i", *args, "--as", SERVICE_ACCOUNT, check=False)
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), result.stderr
        if (answer == "yes") == expected or time.monotonic() > deadline:
            return answer == "yes"
        time.sleep(0.2)


DELETE_METHOD_RIGHTS = [("delete", "pods", "-A"), ("patch", "pods", "--subresource=status", "-A")]
LENDING_RIGHTS = [("patch", "pods", "--subresource=resize", "-A"), ("patch", "pods", "-A")]


def test_eviction_method_delete_rights_come_with_its_component_only(
    admin: Kubectl, rbac: None, cluster: Cluster
) -> None:
    objects = build(admin, DEPLOY / "components" / "eviction-delete")
    assert ["ClusterRole", "ClusterRoleBinding"] == [o["kind"] for o in objects]
    assert [False, False] == [can_i(admin, args, False) for args in DELETE_METHOD_RIGHTS]
    admin("apply", "-f", "-", input=dump(objects))
    try:
        assert [True, True] == [can_i(admin, args, True) for args in DELETE_METHOD_RIGHTS]
        # The rest is unchanged: only these two rights came with it.
        expected = as_can_i(BASE_CLUSTER_PERMISSIONS | EXPECTED_DELETE_PERMISSIONS)
        assert expected == granted_rights(admin, "default", expected)
    finally:
        admin("delete", "--ignore-not-found", "-f", "-", input=dump(objects))
    assert [False, False] == [can_i(admin, args, False) for args in DELETE_METHOD_RIGHTS]


def test_lending_rights_go_with_the_no_lending_component(
    admin: Kubectl, rbac: None, base_objects: list[dict[str, Any]], deploy_copy: Path
) -> None:
    overlay = deploy_copy / "overlays" / "no-lending"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../../base"],
                "components": ["../../components/no-lending"],
            }
        )
    )
    without = build(admin, overlay)
    gone = {kubectl_name(o) for o in base_objects} - {kubectl_name(o) for o in without}
    assert {
        f"clusterrole.rbac.authorization.k8s.io/{NAME}-lending",
        f"clusterrolebinding.rbac.authorization.k8s.io/{NAME}-lending",
        f"validatingadmissionpolicy.admissionregistration.k8s.io/{NAME}-lending",
        f"validatingadmissionpolicybinding.admissionregistration.k8s.io/{NAME}-lending",
    } == gone
    (deployment,) = [o for o in without if o["kind"] == "Deployment"]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RPW_LENDING", "value": "false"} in env
    # Applied as built: the lending binding is deleted, and the rights went with it.
    binding = [
        o
        for o in base_objects
        if kubectl_name(o).endswith(f"clusterrolebinding.rbac.authorization.k8s.io/{NAME}-lending")
    ]
    assert 1 == len(binding)
    assert [True, True] == [can_i(admin, args, True) for args in LENDING_RIGHTS]
    admin("delete", "-f", "-", input=dump(binding))
    try:
        assert [False, False] == [can_i(admin, args, False) for args in LENDING_RIGHTS]
    finally:
        admin("apply", "-f", "-", input=dump(binding))
    assert [True, True] == [can_i(admin, args, True) for args in LENDING_RIGHTS]


# --- the admission policy narrowing lending's rights --------------------------------------

#: A group of the service account's impersonation that may read pods/resize: kubectl
#: patch reads the object before it patches (the service itself only patches).
RESIZE_READERS = "rpw-deploy-test-resize-readers"
AS_SERVICE = ("--as", SERVICE_ACCOUNT, "--as-group", RESIZE_READERS,
              "--as-group", "system:authenticated")  # fmt: skip
FLOOR = '{"app": {"cpu": "1", "memory": "256Mi"}}'


@pytest.fixture(scope="module")
def admission_policy(
    admin: Kubectl, rbac: None, base_objects: list[dict[str, Any]]
) -> Iterator[None]:
    """The base's ValidatingAdmissionPolicy and its binding, applied for real, and the
    resize readers' right to read pods/resize; all removed afterwards."""
    policy = [
        o
        for o in base_objects
        if o["kind"].startswith("ValidatingAdmissionPolicy")
        and o["metadata"]["name"].endswith("-lending")
    ]
    assert 2 == len(policy)
    readers = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": RESIZE_READERS},
         "rules": [{"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": RESIZE_READERS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": RESIZE_READERS},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                       "name": RESIZE_READERS}]},
    ]  # fmt: skip
    admin("apply", "-f", "-", input=dump(policy + readers))
    # Served a moment after it is created: wait until it refuses what it must, so that
    # no test passes for a policy not yet in force.
    probe = lender_pod(f"rpw-deploy-test-probe-{secrets.token_hex(3)}", {})
    admin("apply", "-n", "default", "-f", "-", input=dump([probe]))
    name = probe["metadata"]["name"]
    deadline = time.monotonic() + 30
    for attempt in range(1_000_000):
        # A new size each time: a resize to the size it has is no change to refuse.
        cpu = f"{2000 - attempt % 2 * 100}m"
        result = admin("-n", "default", "patch", "pod", name, "--subresource", "resize",
                       "-p", resize(cpu=cpu), *AS_SERVICE, check=False)  # fmt: skip
        if "ValidatingAdmissionPolicy" in result.stderr:
            break
        assert time.monotonic() < deadline, result.stdout + result.stderr
        time.sleep(0.3)
    admin("-n", "default", "delete", "pod", name, "--wait=false")
    yield
    admin("delete", "--ignore-not-found", "-f", "-", input=dump(policy + readers))


def lender_pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    """Guaranteed, 3 CPU and 1Gi in its container ``app``, on node-1."""
    amounts = {"cpu": "3", "memory": "1Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "busybox",
                            "resources": {"requests": amounts, "limits": amounts}}],
        },
    }  # fmt: skip


def resize(**amounts: str) -> str:
    return json.dumps({"spec": {"containers": [
        {"name": "app", "resources": {"requests": amounts, "limits": amounts}}]}})  # fmt: skip


LOANS = {"resize-preemption.io/loans": "[]"}
OPTED_IN = {"resize-preemption.io/floor": FLOOR}
POLICY_CASES = [
    # (the pod's annotations, kubectl arguments after "-n NS", as the service?, refused with)
    ({}, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(cpu="2")), True,
     "only pods that opted in to lending"),
    (OPTED_IN, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(cpu="2")), True, ""),
    (OPTED_IN, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(cpu="1")), True, ""),
    (OPTED_IN, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(cpu="500m")), True,
     "only down to the pod's floor"),
    (OPTED_IN, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(memory="256Mi")),
     True, ""),
    (OPTED_IN, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(memory="128Mi")),
     True, "only down to the pod's floor"),
    (OPTED_IN, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(cpu="4")), True,
     "raise one only on a pod that carries a loan record"),
    (OPTED_IN | LOANS, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(cpu="4")),
     True, ""),
    (OPTED_IN, ("patch", "pod", "p", "--subresource", "resize", "-p", resize(cpu="500m")), False,
     ""),
    (OPTED_IN, ("annotate", "pod", "p", "resize-preemption.io/loans=[]"), True, ""),
    (OPTED_IN | LOANS, ("annotate", "pod", "p", "resize-preemption.io/loans-"), True, ""),
    (OPTED_IN, ("annotate", "pod", "p", "other=x"), True, "only in its loan record"),
    (OPTED_IN, ("annotate", "pod", "p", "--overwrite", "resize-preemption.io/floor={}"), True,
     "only in its loan record"),
    (OPTED_IN, ("label", "pod", "p", "x=y"), True, "only in its loan record"),
    (OPTED_IN, ("patch", "pod", "p", "-p", '{"spec": {"activeDeadlineSeconds": 60}}'), True,
     "only in its loan record"),
    (OPTED_IN, ("annotate", "pod", "p", "other=x"), False, ""),
]  # fmt: skip


POLICY_IDS = [
    "resize-of-a-pod-not-opted-in",
    "lower-cpu-above-the-floor",
    "lower-cpu-to-the-floor",
    "lower-cpu-below-the-floor",
    "lower-memory-to-the-floor",
    "lower-memory-below-the-floor",
    "raise-without-a-loan-record",
    "raise-with-a-loan-record",
    "another-account-below-the-floor",
    "write-the-loan-record",
    "remove-the-loan-record",
    "another-annotation",
    "change-the-floor",
    "a-label",
    "the-spec",
    "another-account-annotates",
]


def policy_case(case: tuple[object, ...], case_id: str) -> Any:
    """A case of POLICY_CASES; one that lowers a memory limit in place needs 1.34."""
    marks = [pytest.mark.needs_kube(34, NO_MEMORY_LIMIT_DECREASE)] if "memory" in case_id else []
    return pytest.param(*case, id=case_id, marks=marks)


@pytest.mark.parametrize(
    ("annotations", "args", "as_service", "refused_with"),
    [policy_case(case, i) for case, i in zip(POLICY_CASES, POLICY_IDS, strict=True)],
)
def test_admission_policy_lets_the_service_make_loans_and_nothing_else(
    admin: Kubectl,
    admission_policy: None,
    namespace: str,
    annotations: dict[str, str],
    args: tuple[str, ...],
    as_service: bool,
    refused_with: str,
) -> None:
    admin("apply", "-n", namespace, "-f", "-", input=dump([lender_pod("p", annotations)]))
    who = AS_SERVICE if as_service else ()
    result = admin("-n", namespace, *args, *who, check=False)
    if refused_with:
        assert 0 != result.returncode
        assert "denied request" in result.stderr and refused_with in result.stderr, result.stderr
    else:
        assert 0 == result.returncode, result.stderr


# --- certs --patch-webhooks -------------------------------------------------------------


@pytest.fixture
def throwaway_configurations(cluster: Cluster) -> Iterator[str]:
    """A validating and a mutating configuration that match no namespace."""
    name = f"rpw-deploy-test-{secrets.token_hex(3)}"
    api = cluster.client
    paths = {
        kind: f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}webhookconfigurations"
        for kind in ("Validating", "Mutating")
    }
    for kind, path in paths.items():
        webhook = {
            "name": f"{kind.lower()}.deploy-test.resize-preemption.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "clientConfig": {"service": {"name": NAME, "namespace": NAMESPACE, "path": "/x"}},
            "namespaceSelector": {"matchLabels": {"rpw-deploy-test/never": "true"}},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["pods/resize"],
                }
            ],
        }
        body = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": f"{kind}WebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [webhook],
        }
        api.create(path, body)
    yield name
    for path in paths.values():
        try:
            api.delete(f"{path}/{name}")
        except ApiError as e:
            if e.status != 404:
                raise


def test_certs_patch_webhooks_sets_the_ca_bundle_on_both_configurations(
    cluster: Cluster, throwaway_configurations: str, tmp_path: Path
) -> None:
    name = throwaway_configurations
    result = run_certs(
        "--out", str(tmp_path), "--patch-webhooks", "--webhook-config", name,
        "--kubeconfig", str(cluster.kubeconfig),
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    ca = (tmp_path / "ca.crt").read_bytes()
    assert base64.b64decode(result.stdout) == ca
    for kind in ("validating", "mutating"):
        live = cluster.client.get(
            f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{name}"
        )
        assert base64.b64decode(live["webhooks"][0]["clientConfig"]["caBundle"]) == ca
        assert f"{kind.capitalize()}WebhookConfiguration {name}: caBundle set on" in result.stderr


def test_certs_patch_webhooks_of_a_missing_configuration_exits_1(
    cluster: Cluster, tmp_path: Path
) -> None:
    result = run_certs(
        "--out", str(tmp_path), "--patch-webhooks", "--webhook-config", "rpw-no-such-config",
        "--kubeconfig", str(cluster.kubeconfig),
    )  # fmt: skip

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "error: no webhook configuration named rpw-no-such-config: apply the manifests first"
    )
