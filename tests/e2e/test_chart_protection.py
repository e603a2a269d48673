"""The chart's protection of the objects that decide whom the service trusts and what the
API server sends it (templates/protection.yaml), on the real API server.

In mode service the service's account holds ``patch`` on its webhook configurations, to
set their caBundle; RBAC cannot narrow a patch to one field, so a policy does: that
account may change caBundle alone, and nobody but ``protection.managers`` (the cluster's
admins by default: whoever runs helm) may change anything else. The ConfigMap
``<fullname>-client-ca`` (``clientAuth.caBundle``), the CA the review port trusts, is
written by the managers alone, whatever ConfigMap rights another account holds in the
namespace (the node agent's).

The chart is rendered by helm under a release and namespace of this module's own, and its
webhook configuration, client CA, service account with its rights and the two policies are
applied for real; the configuration's namespaceSelector matches no namespace, so no review
is sent while it exists. The callers: the cluster's admin (a manager), a token of the
service's account, and a token of an ``intruder`` account granted every right the policy
has to refuse: get, patch and update on webhook configurations and ConfigMaps.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster, Kubectl
from tests.e2e.helm_tools import CHART, LOCAL_BUILD, helm_binary, render, set_args
from tests.e2e.service_support import account_kubeconfig
from webhook.kube.webhookconfig import patch_webhook_ca_bundles
from webhook.tls import pki

pytestmark = pytest.mark.e2e

INTRUDER = "intruder"
VALIDATING = "validatingwebhookconfiguration"
#: The policies' messages, as kubectl shows a refusal.
SERVICE_REFUSED = "may change only the caBundle of its webhook configurations"
OTHERS_REFUSED = "may change its webhook configurations"
CA_REFUSED = "may write the CA its review port trusts"


@dataclass(frozen=True)
class Scene:
    """The applied objects' names and the three callers."""

    name: str
    namespace: str
    admin: Kubectl
    service: Kubectl
    intruder: Kubectl
    service_kubeconfig: str

    @property
    def client_ca(self) -> str:
        return f"{self.name}-client-ca"


def _intruders_rights(namespace: str) -> list[dict[str, Any]]:
    """An account holding every right the policies must refuse."""
    rbac = "rbac.authorization.k8s.io"
    subject = [{"kind": "ServiceAccount", "name": INTRUDER, "namespace": namespace}]
    cluster_rule = {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
        "verbs": ["get", "list", "patch", "update"],
    }
    configmaps = {"apiGroups": [""], "resources": ["configmaps"],
                  "verbs": ["get", "list", "create", "patch", "update"]}  # fmt: skip
    name = f"{namespace}-{INTRUDER}"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": INTRUDER, "namespace": namespace}},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [cluster_rule]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": name},
         "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "Role",
         "metadata": {"name": INTRUDER, "namespace": namespace}, "rules": [configmaps]},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": INTRUDER, "namespace": namespace},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": INTRUDER},
         "subjects": subject},
    ]  # fmt: skip


def _protects(obj: dict[str, Any]) -> bool:
    """Whether ``obj`` is one of templates/protection.yaml's."""
    return str(obj["metadata"]["name"]).endswith(("-webhook-configurations", "-client-ca"))


def _chart_objects(release: str, namespace: str) -> list[dict[str, Any]]:
    """The chart's objects this module applies: its webhook configuration
    (selecting no namespace), client CA, service account with its ClusterRole, and the
    protection policies."""
    ca = pki.make_ca("protection test").cert_pem.decode()
    values = {"clientAuth.enabled": True, "clientAuth.caBundle": ca}
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding",
              "ValidatingWebhookConfiguration", "ConfigMap",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    objects = [
        o
        for o in render(values, release=release, namespace=namespace)
        if o["kind"] in wanted
        and not (o["kind"].startswith("ValidatingAdmission") and not _protects(o))
    ]
    for obj in objects:
        if obj["kind"] == "ValidatingWebhookConfiguration":
            for webhook in obj["webhooks"]:
                webhook["namespaceSelector"] = {"matchLabels": {"rpw-protection": "none"}}
    policies = {o["metadata"]["name"] for o in objects if o["kind"].endswith("Policy")}
    # The ConfigMap is the client CA: no dashboard or other is rendered here.
    assert 2 == len(policies), policies
    return objects


def _wait_in_force(intruder: Kubectl, name: str) -> None:
    """Policies are served a moment after they are created: wait until the intruder's
    change of a timeout is refused by one."""
    deadline = time.monotonic() + 30
    while True:
        tried = _patch(intruder, name, [_op("replace", "/webhooks/0/timeoutSeconds", 7)])
        if "ValidatingAdmissionPolicy" in tried.stderr:
            return
        assert time.monotonic() < deadline, tried.stdout + tried.stderr
        time.sleep(0.3)


@pytest.fixture(scope="module")
def scene(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    suffix = secrets.token_hex(3)
    release, namespace = f"rpw-prot-{suffix}", f"rpw-prot-{suffix}"
    objects = _chart_objects(release, namespace)
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    name = config["metadata"]["name"]
    admin = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig, namespace)
    rights = _intruders_rights(namespace)
    policies = [o for o in objects if o["kind"].startswith("ValidatingAdmission")]
    # The release namespace is the operator's (helm --create-namespace), not the chart's.
    spaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}]
    rest = [o for o in objects if o not in policies]
    # Policies last: everything else is in place before they judge.
    admin("apply", "-f", "-", input=yaml.safe_dump_all([*spaces, *rights, *rest, *policies]))
    service_config = account_kubeconfig(
        cluster, namespace, name, tmp_path_factory.mktemp("service")
    )
    intruder_config = account_kubeconfig(
        cluster, namespace, INTRUDER, tmp_path_factory.mktemp("intruder")
    )
    built = Scene(
        name=name,
        namespace=namespace,
        admin=admin,
        service=Kubectl(cluster.binaries.kubectl, service_config, namespace),
        intruder=Kubectl(cluster.binaries.kubectl, intruder_config, namespace),
        service_kubeconfig=str(service_config),
    )
    try:
        _wait_in_force(built.intruder, name)
        yield built
    finally:
        for batch in (policies, [*rights, *rest, *spaces]):
            admin("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                  input=yaml.safe_dump_all(batch), check=False)  # fmt: skip


def _op(op: str, path: str, value: Any) -> dict[str, Any]:
    return {"op": op, "path": path, "value": value}


def _patch(caller: Kubectl, name: str, ops: list[dict[str, Any]]) -> Any:
    # Cluster-scoped: the caller's namespace plays no part.
    return caller("patch", VALIDATING, name, "--type=json", "-p", json.dumps(ops), check=False)


def _read(scene: Scene) -> dict[str, Any]:
    got = scene.admin("get", VALIDATING, scene.name, "-o", "json")
    config: dict[str, Any] = json.loads(got.stdout)
    return config


def _refused(result: Any, message: str) -> None:
    assert 0 != result.returncode, result.stdout
    assert "ValidatingAdmissionPolicy" in result.stderr and message in result.stderr, result.stderr


#: Changes other than caBundle, each as a JSON patch of the chart's configuration.
CHANGES = {
    "rules": [_op("replace", "/webhooks/0/rules/0/operations", ["CREATE"])],
    "target": [_op("replace", "/webhooks/0/clientConfig/service/name", "elsewhere")],
    "url": [
        _op("remove", "/webhooks/0/clientConfig/service", None),
        _op("add", "/webhooks/0/clientConfig/url", "https://attacker.example/validate"),
    ],
    # The chart's is Ignore: Fail would stop every resize while the service is down.
    "failure-policy": [_op("replace", "/webhooks/0/failurePolicy", "Fail")],
    "namespace-selector": [_op("replace", "/webhooks/0/namespaceSelector", {})],
    "label": [_op("add", "/metadata/labels/extra", "x")],
}


def _without_value(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in o.items() if not (k == "value" and o["op"] == "remove")} for o in ops]


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_another_identity_changing_the_webhook_configuration_is_refused(
    scene: Scene, change: str
) -> None:
    before = _read(scene)["webhooks"]
    _refused(_patch(scene.intruder, scene.name, _without_value(CHANGES[change])), OTHERS_REFUSED)
    assert before == _read(scene)["webhooks"]


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_services_identity_changing_anything_but_the_ca_bundle_is_refused(
    scene: Scene, change: str
) -> None:
    before = _read(scene)["webhooks"]
    _refused(_patch(scene.service, scene.name, _without_value(CHANGES[change])), SERVICE_REFUSED)
    assert before == _read(scene)["webhooks"]


def test_the_service_sets_the_ca_bundle_as_it_does_when_it_renews(scene: Scene) -> None:
    encoded = base64.b64encode(pki.make_ca("renewed").cert_pem).decode()
    outcomes = patch_webhook_ca_bundles(
        encoded, kubeconfig=scene.service_kubeconfig, names=(scene.name,)
    )
    assert [o.found for o in outcomes if o.kind == "ValidatingWebhookConfiguration"] == [True]
    assert [encoded] == [w["clientConfig"]["caBundle"] for w in _read(scene)["webhooks"]]


def test_another_identity_changing_the_ca_bundle_is_refused(scene: Scene) -> None:
    bundle = base64.b64encode(pki.make_ca("attacker").cert_pem).decode()
    ops = [_op("add", "/webhooks/0/clientConfig/caBundle", bundle)]
    _refused(_patch(scene.intruder, scene.name, ops), OTHERS_REFUSED)


def test_a_manager_still_changes_the_configuration(scene: Scene) -> None:
    ops = [_op("replace", "/webhooks/0/timeoutSeconds", 9)]
    changed = _patch(scene.admin, scene.name, ops)
    assert 0 == changed.returncode, changed.stderr
    assert 9 == _read(scene)["webhooks"][0]["timeoutSeconds"]


def test_a_write_to_the_client_ca_by_another_identity_is_refused(scene: Scene) -> None:
    before = scene.admin("get", "configmap", scene.client_ca, "-o", "json").stdout
    forged = json.dumps({"data": {"ca.crt": pki.make_ca("attacker").cert_pem.decode()}})
    written = scene.intruder("patch", "configmap", scene.client_ca, "-p", forged, check=False)
    _refused(written, CA_REFUSED)
    after = scene.admin("get", "configmap", scene.client_ca, "-o", "json").stdout
    assert json.loads(before)["data"] == json.loads(after)["data"]
    # Its other ConfigMaps are not the policy's.
    made = scene.intruder("create", "configmap", "other", "--from-literal=a=b", check=False)
    assert 0 == made.returncode, made.stderr


def test_the_managers_write_the_client_ca(scene: Scene) -> None:
    renewed = json.dumps({"data": {"ca.crt": pki.make_ca("renewed").cert_pem.decode()}})
    written = scene.admin("patch", "configmap", scene.client_ca, "-p", renewed, check=False)
    assert 0 == written.returncode, written.stderr


def _policy_names(values: dict[str, Any]) -> set[str]:
    return {
        o["metadata"]["name"].removeprefix("resize-preemption-webhook-")
        for o in render(values)
        if o["kind"] == "ValidatingAdmissionPolicy"
    }


@pytest.mark.parametrize(
    ("values", "protected"),
    [
        ({}, {"webhook-configurations"}),
        ({"certificates.mode": "cert-manager"}, set()),
        ({"certificates.mode": "cert-manager", "clientAuth.enabled": True,
          "clientAuth.caBundle": "x"}, {"client-ca"}),
        ({"clientAuth.enabled": True, "clientAuth.caBundle": "x"},
         {"webhook-configurations", "client-ca"}),
        ({"clientAuth.enabled": True}, {"webhook-configurations"}),
    ],
    ids=["default", "cert-manager", "cert-manager-client-ca", "client-ca", "service-keeps-ca"],
)  # fmt: skip
def test_a_policy_is_rendered_where_its_object_is_the_charts(
    values: dict[str, Any], protected: set[str]
) -> None:
    # cert-manager's injector, not the service, sets caBundle there: the service holds no
    # right on the configurations. Without caBundle there is no client-ca ConfigMap.
    assert protected == _policy_names(values) - {"lending", "leases"}


def test_the_managers_are_the_values() -> None:
    values = {"protection.managers.groups": ["ops"], "protection.managers.users": ["alice"]}
    (policy,) = [
        o for o in render(values)
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"].endswith("-webhook-configurations")
    ]  # fmt: skip
    (manager,) = [v for v in policy["spec"]["variables"] if v["name"] == "manager"]
    assert (
        'request.userInfo.username in ["alice"] || '
        'request.userInfo.?groups.orValue([]).exists(g, g in ["ops"])'
    ) == manager["expression"]


def test_helm_installs_upgrades_and_uninstalls_the_default_chart_under_its_policy(
    cluster: Cluster,
) -> None:
    """The policy does not stand in the installer's way: helm, run by the cluster's admin,
    installs the default chart (mode service, the policy with it), upgrades a field of its
    webhook configuration and uninstalls it."""
    suffix = secrets.token_hex(3)
    release, namespace = f"rpw-prot-helm-{suffix}", f"rpw-prot-helm-{suffix}"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}

    def helm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(helm_binary()), "--namespace", namespace, *args],
            capture_output=True, text=True, timeout=180, env=env, check=False,
        )  # fmt: skip

    # No namespace selected: no review is sent while the release exists.
    # Installed into a namespace made beforehand, as an operator does with
    # --create-namespace; no namespace selected: no review is sent meanwhile.
    values = {**LOCAL_BUILD,
              "webhook.namespaceSelector": {"matchLabels": {"rpw-protection": "none"}}}  # fmt: skip
    admin = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig)
    admin("create", "namespace", namespace)
    try:
        installed = helm("install", release, str(CHART), *set_args(values))
        assert 0 == installed.returncode, installed.stderr
        name = f"{release}-resize-preemption-webhook"
        policy = admin("get", "validatingadmissionpolicy", f"{name}-webhook-configurations")
        assert 0 == policy.returncode
        upgraded = helm(
            "upgrade", release, str(CHART), "--reuse-values",
            *set_args({"webhook.timeoutSeconds": 7}),
        )  # fmt: skip
        assert 0 == upgraded.returncode, upgraded.stderr
        config = json.loads(admin("get", VALIDATING, name, "-o", "json").stdout)
        assert [7] == [w["timeoutSeconds"] for w in config["webhooks"]]
        uninstalled = helm("uninstall", release, "--wait")
        assert 0 == uninstalled.returncode, uninstalled.stderr
        assert 0 != admin("get", VALIDATING, name, check=False).returncode
    finally:
        helm("uninstall", release, "--ignore-not-found")
        admin("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)
