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
from tests.e2e.conftest import Cluster, Kubectl
from tests.unit.test_manifests import (
    EXPECTED_CLUSTER_PERMISSIONS,
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


def test_pod_template_passes_restricted_pod_security_and_gets_critical_priority(
    admin: Kubectl, rbac: None, base_objects: list[dict[str, Any]]
) -> None:
    """PodSecurity enforces only on pods: create one from the template (dry run) in the
    namespace that enforces "restricted"; the Priority plugin resolves its class."""
    (deployment,) = [o for o in base_objects if o["kind"] == "Deployment"]
    template = deployment["spec"]["template"]
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
    assert created["spec"]["priority"] == 2_000_000_000


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


def test_service_account_has_exactly_the_cluster_wide_rights(admin: Kubectl, rbac: None) -> None:
    expected = as_can_i(EXPECTED_CLUSTER_PERMISSIONS)
    assert granted_rights(admin, "default", expected) == expected


def test_service_account_has_exactly_the_lease_rights_in_its_namespace(
    admin: Kubectl, rbac: None
) -> None:
    expected = as_can_i(EXPECTED_CLUSTER_PERMISSIONS | EXPECTED_NAMESPACE_PERMISSIONS)
    assert granted_rights(admin, NAMESPACE, expected) == expected


def test_baseline_holds_none_of_the_expected_rights(admin: Kubectl, rbac: None) -> None:
    """Every account has some rights (discovery, self reviews, ...); none of them may be one
    of the webhook's, or subtracting the baseline would hide it."""
    baseline = can_i_list(admin, BASELINE_ACCOUNT, NAMESPACE)
    expected = as_can_i(EXPECTED_CLUSTER_PERMISSIONS | EXPECTED_NAMESPACE_PERMISSIONS)
    assert not baseline & expected
    assert not any(resource.startswith(("pods", "leases")) for resource, _, _ in baseline)


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (("create", "pods", "--subresource=eviction", "-A"), True),
        (("patch", "pods", "--subresource=status", "-A"), True),
        (("delete", "pods", "-A"), True),
        (("watch", "poddisruptionbudgets.policy", "-A"), True),
        (("list", "priorityclasses.scheduling.k8s.io"), True),
        (("create", "events.events.k8s.io", "-n", "default"), True),
        (("update", "leases.coordination.k8s.io", "-n", NAMESPACE), True),
        (("create", "leases.coordination.k8s.io", "-n", "default"), False),
        (("delete", "leases.coordination.k8s.io", "-n", NAMESPACE), False),
        (("patch", "leases.coordination.k8s.io", "-n", NAMESPACE), False),
        (("get", "secrets", "-n", NAMESPACE), False),
        (("update", "pods", "-A"), False),
        # A lender's loan record (its annotation); update stays refused.
        (("patch", "pods", "-A"), True),
        (("patch", "pods", "--subresource=resize", "-A"), True),
        (("create", "pods", "-A"), False),
        (("patch", "nodes"), False),
        (("create", "events", "-n", "default"), False),
        (("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io"), False),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v),
)
def test_can_i(admin: Kubectl, rbac: None, args: tuple[str, ...], allowed: bool) -> None:
    deadline = time.monotonic() + 15
    while True:
        result = admin("auth", "can-i", *args, "--as", SERVICE_ACCOUNT, check=False)
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), result.stderr
        if (answer == "yes") == allowed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer == ("yes" if allowed else "no")


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
