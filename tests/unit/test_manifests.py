"""Structural checks of deploy/ without kustomize: every YAML parses, the webhook
configurations carry the safety settings, the Deployment is locked down, and RBAC grants
exactly the permissions the service needs (tests/e2e/test_deploy.py proves the same against
a real API server)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.base.settings import SETTINGS, env_name, load_config
from webhook.core.model import FIT_TO_NODE_ANNOTATION
from webhook.tls import certs

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
MUTATING = DEPLOY / "components" / "mutating"
CERT_MANAGER = DEPLOY / "overlays" / "cert-manager"
SELF_SIGNED = DEPLOY / "overlays" / "self-signed"

NAMESPACE = "resize-preemption-system"
NAME = "resize-preemption-webhook"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{NAME}"
TLS_SECRET = "resize-preemption-webhook-tls"
TLS_DIR = "/etc/rpw/tls"

#: (apiGroup, resource, verb) the ServiceAccount may use in every namespace.
EXPECTED_CLUSTER_PERMISSIONS = frozenset(
    {("", "pods", v) for v in ("get", "list", "watch")}
    | {("", "pods/eviction", "create")}
    | {("", "nodes", v) for v in ("get", "list", "watch")}
    | {("", "namespaces", v) for v in ("get", "list", "watch")}
    | {("policy", "poddisruptionbudgets", v) for v in ("get", "list", "watch")}
    | {("scheduling.k8s.io", "priorityclasses", v) for v in ("get", "list", "watch")}
    | {("events.k8s.io", "events", v) for v in ("create", "patch")}
)
#: What lending adds (deploy/base/rbac-lending.yaml; left out by components/no-lending).
EXPECTED_LENDING_PERMISSIONS = frozenset({("", "pods/resize", "patch"), ("", "pods", "patch")})
#: What eviction method delete adds (components/eviction-delete).
EXPECTED_DELETE_PERMISSIONS = frozenset({("", "pods", "delete"), ("", "pods/status", "patch")})
#: ... and in its own namespace only.
EXPECTED_NAMESPACE_PERMISSIONS = frozenset(
    ("coordination.k8s.io", "leases", v) for v in ("get", "list", "watch", "create", "update")
)


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization(directory: Path) -> dict[str, Any]:
    docs = load_documents(directory / "kustomization.yaml")
    assert len(docs) == 1
    return docs[0]


def resources_of(directory: Path) -> list[dict[str, Any]]:
    """The objects a kustomization lists in ``resources`` (files; directories recursively)."""
    objects: list[dict[str, Any]] = []
    for entry in kustomization(directory).get("resources", []):
        path = (directory / entry).resolve()
        objects += resources_of(path) if path.is_dir() else load_documents(path)
    return objects


def one(objects: list[dict[str, Any]], kind: str, name: str = NAME) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return resources_of(BASE)


@pytest.fixture(scope="module")
def deployment(base: list[dict[str, Any]]) -> dict[str, Any]:
    return one(base, "Deployment")


@pytest.fixture(scope="module")
def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.fixture(scope="module")
def mutating() -> dict[str, Any]:
    return one(resources_of(MUTATING), "MutatingWebhookConfiguration")


def all_yaml_files() -> Iterator[Path]:
    for path in sorted(DEPLOY.rglob("*.yaml")):
        parts = path.relative_to(DEPLOY).parts
        # tls/ is written by the certs command; the chart (templates, values) and the
        # Prometheus rules are not manifests: tests/e2e/test_helm_chart.py checks them.
        if not {"tls", "helm", "prometheus"} & set(parts):
            yield path


# --- files and kustomizations -----------------------------------------------------------


@pytest.mark.parametrize("path", list(all_yaml_files()), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses_into_objects_with_kind_and_name(path: Path) -> None:
    docs = load_documents(path)

    assert docs, f"{path} is empty"
    for doc in docs:
        assert isinstance(doc, dict)
        assert doc.get("apiVersion") and doc.get("kind")
        if doc["kind"] not in ("Kustomization", "Component"):
            assert doc["metadata"]["name"]


@pytest.mark.parametrize("directory", [BASE, MUTATING, CERT_MANAGER, SELF_SIGNED], ids=str)
def test_kustomization_references_exist(directory: Path) -> None:
    k = kustomization(directory)
    for entry in k.get("resources", []) + k.get("components", []):
        assert (directory / entry).exists(), f"{directory}: {entry} is missing"
    for patch in k.get("patches", []):
        if "path" in patch and not patch["path"].startswith("tls/"):
            assert (directory / patch["path"]).is_file()


def test_base_lists_every_manifest_in_its_directory() -> None:
    listed = set(kustomization(BASE)["resources"])
    present = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_namespaced_objects_live_in_the_webhooks_namespace(base: list[dict[str, Any]]) -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for obj in base:
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"], obj["kind"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]
    assert one(base, "Namespace", NAMESPACE)


def test_namespace_enforces_the_restricted_pod_security_standard(
    base: list[dict[str, Any]],
) -> None:
    labels = one(base, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


# --- webhook configurations -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"])
def test_webhook_safety_settings(
    base: list[dict[str, Any]], mutating: dict[str, Any], kind: str
) -> None:
    config = one(base, kind) if kind.startswith("Validating") else mutating
    assert config["metadata"]["name"] == NAME
    (webhook,) = config["webhooks"]

    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["failurePolicy"] == "Ignore"
    assert 1 <= webhook["timeoutSeconds"] <= 5
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/resize"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": [NAMESPACE, "kube-system"],
            }
        ]
    }
    # Fully qualified: three or more DNS labels.
    assert re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+){2,}", webhook["name"])
    assert "caBundle" not in webhook["clientConfig"]
    assert "url" not in webhook["clientConfig"]


def test_webhooks_call_the_service_endpoints(
    base: list[dict[str, Any]], mutating: dict[str, Any], container: dict[str, Any]
) -> None:
    service = one(base, "Service")
    https = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    container_port = next(p for p in container["ports"] if p["name"] == https["targetPort"])
    assert (https["port"], container_port["containerPort"]) == (443, 8443)

    paths = []
    for config in (one(base, "ValidatingWebhookConfiguration"), mutating):
        ref = config["webhooks"][0]["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"], ref["port"]) == (NAME, NAMESPACE, 443)
        paths.append(ref["path"])
    assert paths == ["/validate-resize", "/mutate-resize"]


def test_mutating_webhook_is_opt_in_and_never_reinvoked(mutating: dict[str, Any]) -> None:
    (webhook,) = mutating["webhooks"]

    assert webhook["reinvocationPolicy"] == "Never"
    (condition,) = webhook["matchConditions"]
    expression = " ".join(condition["expression"].split())
    assert f"object.metadata.annotations['{FIT_TO_NODE_ANNOTATION}'] == 'true'" in expression
    assert f"'{FIT_TO_NODE_ANNOTATION}' in object.metadata.annotations" in expression


def test_mutating_component_is_a_component_with_only_the_configuration() -> None:
    k = kustomization(MUTATING)
    assert k["kind"] == "Component"
    assert [o["kind"] for o in resources_of(MUTATING)] == ["MutatingWebhookConfiguration"]


# --- Deployment -------------------------------------------------------------------------


def test_deployment_runs_two_spread_replicas_at_the_default_priority(
    deployment: dict[str, Any],
) -> None:
    spec = deployment["spec"]
    pod = spec["template"]["spec"]

    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # Installs on every cluster; a critical class outside kube-system may need a quota.
    assert "priorityClassName" not in pod
    assert pod["serviceAccountName"] == NAME
    keys = {c["topologyKey"] for c in pod.get("topologySpreadConstraints", [])}
    anti = pod.get("affinity", {}).get("podAntiAffinity")
    assert "kubernetes.io/hostname" in keys or anti
    pod_labels = spec["template"]["metadata"]["labels"]
    for constraint in pod.get("topologySpreadConstraints", []):
        assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()


def test_pod_and_container_security_context(
    deployment: dict[str, Any], container: dict[str, Any]
) -> None:
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    ctx = container["securityContext"]

    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == 65532
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not ctx.get("privileged")


def test_probes_use_https_on_the_serving_port(container: dict[str, Any]) -> None:
    https = next(p for p in container["ports"] if p["name"] == "https")
    assert https["containerPort"] == 8443
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTPS", "https")
    metrics = next(p for p in container["ports"] if p["name"] == "metrics")
    assert metrics["containerPort"] == 9090


def test_container_command_serves_tls_from_the_mounted_secret(
    deployment: dict[str, Any], container: dict[str, Any]
) -> None:
    args = container["args"]
    flags = dict(zip(args[1::2], args[2::2], strict=True))

    assert container["command"] == ["python", "-m", "webhook"]
    assert args[0] == "serve"
    assert flags == {
        "--tls-cert": f"{TLS_DIR}/tls.crt",
        "--tls-key": f"{TLS_DIR}/tls.key",
        "--port": "8443",
        "--metrics-port": "9090",
        "--workers": "2",
        "--metrics-host": "$(POD_IP)",
    }
    (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert {"fieldRef": {"fieldPath": "status.podIP"}} == pod_ip["valueFrom"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert mounts["tls"]["mountPath"] == TLS_DIR and mounts["tls"]["readOnly"] is True
    assert volumes["tls"]["secret"]["secretName"] == TLS_SECRET
    assert mounts["tmp"]["mountPath"] == "/tmp"
    assert "emptyDir" in volumes["tmp"]


def test_one_worker_process_per_core_of_the_cpu_limit(container: dict[str, Any]) -> None:
    args = container["args"]
    workers = int(args[args.index("--workers") + 1])
    assert int(container["resources"]["limits"]["cpu"]) == workers


def test_environment_names_the_pod_and_its_namespace_and_is_valid(
    container: dict[str, Any],
) -> None:
    env = {e["name"]: e for e in container["env"]}

    assert env["RPW_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert (
        env["RPW_SERVICE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    )
    # POD_IP is no setting: the metrics port's --metrics-host reads it.
    known = {env_name(s) for s in SETTINGS} | {"POD_IP"}
    assert set(env) <= known, f"unknown settings: {set(env) - known}"
    literal = {k: e["value"] for k, e in env.items() if "value" in e}
    config = load_config(
        env={**literal, "RPW_IDENTITY": "pod-0", "RPW_SERVICE_NAMESPACE": NAMESPACE}
    )
    assert (config.identity, config.namespace) == ("pod-0", NAMESPACE)


def test_container_has_requests_and_limits(container: dict[str, Any]) -> None:
    resources = container["resources"]
    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= resources[section].keys()


def test_service_and_budget_select_the_webhook_pods(
    base: list[dict[str, Any]], deployment: dict[str, Any]
) -> None:
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(base, "Service")
    budget = one(base, "PodDisruptionBudget")

    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


# --- RBAC -------------------------------------------------------------------------------


def permissions(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    granted = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb))
    return granted


def test_cluster_role_grants_exactly_what_the_service_needs(base: list[dict[str, Any]]) -> None:
    assert permissions(one(base, "ClusterRole")) == EXPECTED_CLUSTER_PERMISSIONS


def test_lending_role_grants_exactly_the_lenders_resize_and_loan_record(
    base: list[dict[str, Any]],
) -> None:
    role = one(base, "ClusterRole", f"{NAME}-lending")
    assert EXPECTED_LENDING_PERMISSIONS == permissions(role)
    binding = one(base, "ClusterRoleBinding", f"{NAME}-lending")
    assert {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": f"{NAME}-lending"} == binding["roleRef"]  # fmt: skip
    assert [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}] == binding["subjects"]


def test_delete_component_grants_exactly_what_eviction_method_delete_needs() -> None:
    objects = resources_of(DEPLOY / "components" / "eviction-delete")
    assert EXPECTED_DELETE_PERMISSIONS == permissions(one(objects, "ClusterRole", f"{NAME}-delete"))
    assert not EXPECTED_DELETE_PERMISSIONS & (
        EXPECTED_CLUSTER_PERMISSIONS | EXPECTED_LENDING_PERMISSIONS
    )


def test_admission_policy_matches_only_the_service_account(base: list[dict[str, Any]]) -> None:
    policy = one(base, "ValidatingAdmissionPolicy", f"{NAME}-lending")
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'system:serviceaccount:{NAMESPACE}:{NAME}'" in condition["expression"]
    assert "Fail" == policy["spec"]["failurePolicy"]
    binding = one(base, "ValidatingAdmissionPolicyBinding", f"{NAME}-lending")
    assert (f"{NAME}-lending", ["Deny"]) == (
        binding["spec"]["policyName"],
        binding["spec"]["validationActions"],
    )


def test_role_grants_exactly_the_lease_verbs_in_its_namespace(base: list[dict[str, Any]]) -> None:
    role = one(base, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert permissions(role) == EXPECTED_NAMESPACE_PERMISSIONS


def test_no_wildcards_and_no_secrets(base: list[dict[str, Any]]) -> None:
    for role in (one(base, "ClusterRole"), one(base, "ClusterRole", f"{NAME}-lending"),
                 one(base, "Role")):  # fmt: skip
        for group, resource, verb in permissions(role):
            assert "*" not in (group, resource, verb)
            assert resource not in ("secrets", "configmaps")


@pytest.mark.parametrize(
    ("binding", "role"), [("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")]
)
def test_bindings_bind_the_service_account(
    base: list[dict[str, Any]], binding: str, role: str
) -> None:
    obj = one(base, binding)

    assert obj["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": NAME}
    assert obj["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    assert one(base, "ServiceAccount")


# --- overlays ---------------------------------------------------------------------------


def test_cert_manager_certificate_covers_the_service_and_fills_the_tls_secret(
    base: list[dict[str, Any]],
) -> None:
    objects = resources_of(CERT_MANAGER)
    certificate = one(objects, "Certificate")
    service = one(base, "Service")
    svc = f"{service['metadata']['name']}.{NAMESPACE}.svc"

    assert certificate["metadata"]["namespace"] == NAMESPACE
    assert {svc, f"{svc}.cluster.local"} <= set(certificate["spec"]["dnsNames"])
    assert certificate["spec"]["secretName"] == TLS_SECRET
    issuer = one(objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = one(objects, "Certificate", issuer["spec"]["ca"]["secretName"])
    assert ca["spec"]["isCA"] is True
    assert "server auth" in certificate["spec"]["usages"]


def test_cert_manager_overlay_injects_the_ca_into_both_configurations() -> None:
    (patch,) = kustomization(CERT_MANAGER)["patches"]
    annotations = yaml.safe_load(patch["patch"])["metadata"]["annotations"]
    certificate = one(resources_of(CERT_MANAGER), "Certificate")

    assert annotations == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{certificate['metadata']['name']}"
    }
    kinds = re.compile(patch["target"]["kind"])
    assert kinds.fullmatch("ValidatingWebhookConfiguration")
    assert kinds.fullmatch("MutatingWebhookConfiguration")
    assert patch["target"]["name"] == NAME


def test_self_signed_overlay_uses_the_files_of_the_certs_command() -> None:
    k = kustomization(SELF_SIGNED)
    (generator,) = k["secretGenerator"]
    (patch,) = k["patches"]

    assert (generator["name"], generator["namespace"]) == (TLS_SECRET, NAMESPACE)
    assert generator["type"] == "kubernetes.io/tls"
    assert generator["options"]["disableNameSuffixHash"] is True
    files = dict(f.split("=", 1) for f in generator["files"])
    assert files == {
        certs.CERT_FILE: f"tls/{certs.CERT_FILE}",
        certs.KEY_FILE: f"tls/{certs.KEY_FILE}",
        certs.CA_FILE: f"tls/{certs.CA_FILE}",
    }
    assert patch["path"] == f"tls/{certs.PATCH_FILE}"
    kinds = re.compile(patch["target"]["kind"])
    assert kinds.fullmatch("ValidatingWebhookConfiguration")
    assert kinds.fullmatch("MutatingWebhookConfiguration")
    assert "/tls/" in (SELF_SIGNED / ".gitignore").read_text().split()


def test_certs_command_defaults_match_the_manifests(base: list[dict[str, Any]]) -> None:
    service = one(base, "Service")
    assert (
        service["metadata"]["name"],
        service["metadata"]["namespace"],
        TLS_SECRET,
    ) == (certs.DEFAULT_SERVICE, certs.DEFAULT_NAMESPACE, certs.DEFAULT_SECRET)


# --- docs/deploy.md "RBAC rationale" says what the manifests grant ------------------------

DEPLOY_DOC = REPO / "docs" / "deploy.md"


def documented_rights() -> dict[tuple[str, str], set[tuple[str, str, str]]]:
    """(kind, name) -> (group, resource, verb) of the table under each bold role heading."""
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    section = text.split("\n## RBAC rationale\n", 1)[1].split("\n## ", 1)[0]
    rights: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
    role: tuple[str, str] | None = None
    for line in section.splitlines():
        heading = re.match(r"\*\*(ClusterRole|Role) `([^`]+)`\*\*", line)
        if line.startswith("#"):
            role = None  # a subsection's tables are not a role's
        if heading:
            role = (heading.group(1), heading.group(2))
            continue
        if not line.startswith("| `") or role is None:
            continue
        group, resource, verbs = (c.strip().strip("`") for c in line.strip("|").split("|")[:3])
        for verb in verbs.split(","):
            rights.setdefault(role, set()).add((group.strip('"'), resource, verb.strip()))
    return rights


def test_the_rbac_rationale_lists_exactly_what_each_role_grants(
    base: list[dict[str, Any]],
) -> None:
    delete = resources_of(DEPLOY / "components" / "eviction-delete")
    assert {
        ("ClusterRole", NAME): permissions(one(base, "ClusterRole")),
        ("ClusterRole", f"{NAME}-lending"): permissions(
            one(base, "ClusterRole", f"{NAME}-lending")
        ),
        ("ClusterRole", f"{NAME}-delete"): permissions(
            one(delete, "ClusterRole", f"{NAME}-delete")
        ),
        ("Role", NAME): permissions(one(base, "Role")),
    } == documented_rights()
