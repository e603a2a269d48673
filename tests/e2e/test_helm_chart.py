"""deploy/helm/resize-preemption-webhook with the real helm: lint, the values schema (good
and bad values), and the one-source-of-truth check - the chart's objects in certificates
mode cert-manager equal `kubectl kustomize deploy/overlays/cert-manager`, with the mutating
component too, and the "provided" certificates mode equals the self-signed overlay minus its
Secret. Helm's own labels (tests/e2e/helm_tools.HELM_LABELS) are the only difference allowed.

Runs helm (built from the Go module proxy by scripts/build-tools.sh on first use, about 4
minutes on 2 cores, then cached) and ``kubectl kustomize`` (the control-plane binaries of
scripts/build-control-plane.sh); no cluster."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.binaries import ensure_binaries
from tests.e2e.helm_tools import (
    CHART,
    LOCAL_BUILD,
    REPO,
    by_key,
    helm,
    render,
    set_args,
    template,
    without_helm_labels,
)
from tests.unit.test_chart_schema import chart_schema
from webhook.base.settings import env_name, load_config
from webhook.cli import _managed_tls, build_parser
from webhook.core.errors import InputError

pytestmark = pytest.mark.e2e

DEPLOY = REPO / "deploy"
NAMESPACE = "resize-preemption-system"
NAME = "resize-preemption-webhook"
RULES = CHART / "files" / "rules.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"

#: settings key of the chart -> service setting (scripts/chart_schema.py).
CHART_SETTINGS = chart_schema.CHART_KEYS


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = ensure_binaries(quiet=True).kubectl
    result = subprocess.run(
        [str(kubectl), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def assert_same_objects(expected: list[dict[str, Any]], rendered: list[dict[str, Any]]) -> None:
    """The same objects but kustomize's Namespace: the chart's go into the release's
    namespace, which helm creates (``--create-namespace``), not the chart."""
    want = by_key([o for o in expected if o["kind"] != "Namespace"])
    got = by_key([without_helm_labels(o) for o in rendered])
    assert sorted(want) == sorted(got)
    for k in want:
        assert want[k] == got[k], f"{k} differs"


def deployment_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return deployment


def env_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    container = deployment_of(objects)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    target = tmp_path / "deploy"
    shutil.copytree(DEPLOY, target, ignore=shutil.ignore_patterns("tls", "helm", "prometheus"))
    return target


def enable_mutating(overlay: Path) -> None:
    path = overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["components"] = ["../../components/mutating"]
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))


# --- helm lint --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"certificates.mode": "self-signed", "mutating.enabled": True},
        {
            "metrics.serviceMonitor.enabled": True,
            "metrics.prometheusRule.enabled": True,
            "metrics.dashboard.enabled": True,
        },
        {"clientAuth.enabled": True},
    ],
    ids=["defaults", "self-signed-with-mutating", "monitoring", "client-auth-service-mode"],
)
def test_helm_lint_is_clean(values: dict[str, Any]) -> None:
    result = helm("lint", "--strict", str(CHART), "--kube-version", "1.37.2",
                  *set_args({**LOCAL_BUILD, **values}))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# --- one source of truth: the chart renders what kustomize builds -----------------------


CERT_MANAGER = {"certificates.mode": "cert-manager"}


def test_cert_manager_mode_renders_the_cert_manager_overlay() -> None:
    assert_same_objects(kustomize(DEPLOY / "overlays" / "cert-manager"), render(CERT_MANAGER))


def test_default_values_render_the_service_overlay() -> None:
    assert_same_objects(kustomize(DEPLOY / "overlays" / "service"), render())


def test_mutating_enabled_renders_the_overlay_with_the_mutating_component(
    deploy_copy: Path,
) -> None:
    overlay = deploy_copy / "overlays" / "cert-manager"
    enable_mutating(overlay)
    assert_same_objects(kustomize(overlay), render({**CERT_MANAGER, "mutating.enabled": True}))


@pytest.mark.parametrize(
    ("components", "values"),
    [
        (["eviction-delete"], {"settings.evictionMethod": "delete"}),
        (["no-lending"], {"settings.lending": False}),
        (["eviction-delete", "no-lending"],
         {"settings.evictionMethod": "delete", "settings.lending": False}),
    ],
    ids=["eviction-delete", "no-lending", "both"],
)  # fmt: skip
def test_rights_follow_the_settings_as_the_components_grant_them(
    deploy_copy: Path, components: list[str], values: dict[str, Any]
) -> None:
    overlay = deploy_copy / "overlays" / "cert-manager"
    path = overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["components"] = [f"../../components/{c}" for c in components]
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    built, rendered = kustomize(overlay), render({**CERT_MANAGER, **values})
    assert_same_objects(built, rendered)
    names = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    lending = "no-lending" not in components
    assert lending == (("ClusterRole", f"{NAME}-lending") in names)
    assert lending == (("ValidatingAdmissionPolicy", f"{NAME}-lending") in names)
    assert ("eviction-delete" in components) == (("ClusterRole", f"{NAME}-delete") in names)


def test_provided_certificates_render_the_self_signed_overlay_without_its_secret(
    deploy_copy: Path,
) -> None:
    overlay = deploy_copy / "overlays" / "self-signed"
    enable_mutating(overlay)
    made = subprocess.run(
        [sys.executable, "-m", "webhook", "certs", "--out", str(overlay / "tls"),
         "--kustomize-patch"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    expected = [o for o in kustomize(overlay) if o["kind"] != "Secret"]
    ca_bundle = made.stdout.strip()
    rendered = render(
        {"certificates.mode": "provided", "certificates.caBundle": ca_bundle,
         "mutating.enabled": True}
    )  # fmt: skip
    assert_same_objects(expected, rendered)


def test_self_signed_mode_makes_a_secret_whose_ca_is_the_ca_bundle() -> None:
    objects = render(
        {"certificates.mode": "self-signed", "mutating.enabled": True,
         "certificates.ipAddresses": ["127.0.0.1"]}
    )  # fmt: skip
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert "kubernetes.io/tls" == secret["type"]
    assert f"{NAME}-tls" == secret["metadata"]["name"]
    configs = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert 2 == len(configs)
    for config in configs:
        assert secret["data"]["ca.crt"] == config["webhooks"][0]["clientConfig"]["caBundle"]
        assert "annotations" not in config["metadata"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [
        NAME,
        f"{NAME}.{NAMESPACE}",
        f"{NAME}.{NAMESPACE}.svc",
        f"{NAME}.{NAMESPACE}.svc.cluster.local",
    ] == names.get_values_for_type(x509.DNSName)
    assert ["127.0.0.1"] == [str(a) for a in names.get_values_for_type(x509.IPAddress)]
    assert not [o for o in objects if o["apiVersion"].startswith("cert-manager.io/")]


CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


#: Every optional object on, so that each one's namespace is checked.
EVERYTHING = {
    "mutating.enabled": True,
    "metrics.serviceMonitor.enabled": True,
    "metrics.prometheusRule.enabled": True,
    "metrics.dashboard.enabled": True,
    "networkPolicy.enabled": True,
    "networkPolicy.apiServerCIDRs": ["10.0.0.1/32"],
    "checkpoint.enabled": True,
    "clientAuth.enabled": True,
    "settings.evictionMethod": "delete",
}


@pytest.mark.parametrize("mode", ["service", "cert-manager", "self-signed"])
def test_every_object_is_in_the_release_namespace_and_none_is_a_namespace(mode: str) -> None:
    result = template({**EVERYTHING, "certificates.mode": mode}, release="edge",
                      namespace="tools")  # fmt: skip
    assert 0 == result.returncode, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [] == [o for o in objects if o["kind"] == "Namespace"]
    assert "resize-preemption-system" not in result.stdout
    for obj in objects:
        assert obj["metadata"]["name"].startswith("edge-resize-preemption-webhook")
        if obj["kind"] not in CLUSTER_SCOPED:
            assert "tools" == obj["metadata"]["namespace"], obj["kind"]
        for subject in obj.get("subjects", []):
            assert "tools" == subject["namespace"], obj["metadata"]["name"]
    (monitor,) = by_kind(objects, "ServiceMonitor").values()
    assert ["tools"] == monitor["spec"]["namespaceSelector"]["matchNames"]
    for config in objects:
        if config["kind"].endswith("WebhookConfiguration"):
            assert "tools" == config["webhooks"][0]["clientConfig"]["service"]["namespace"]
            if mode == "cert-manager":
                assert (
                    "tools/edge-resize-preemption-webhook"
                    == (config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"])
                )


def test_release_name_and_namespace_name_every_object() -> None:
    objects = render(release="edge", namespace="tools")
    assert not [o for o in objects if o["kind"] == "Namespace"]
    for obj in objects:
        assert obj["metadata"]["name"].startswith("edge-resize-preemption-webhook")
        if obj["kind"] not in CLUSTER_SCOPED:
            assert "tools" == obj["metadata"]["namespace"], obj["kind"]
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    webhook = config["webhooks"][0]
    service = {"name": "edge-resize-preemption-webhook", "namespace": "tools",
               "path": "/validate-resize", "port": 443}  # fmt: skip
    assert service == webhook["clientConfig"]["service"]
    assert ["tools", "kube-system"] == webhook["namespaceSelector"]["matchExpressions"][0]["values"]
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    lending, leases = (
        policies["edge-resize-preemption-webhook-lending"],
        policies["edge-resize-preemption-webhook-leases"],
    )
    (condition,) = lending["spec"]["matchConditions"]
    account = "'system:serviceaccount:tools:edge-resize-preemption-webhook'"
    assert account in condition["expression"]
    assert account in leases["spec"]["validations"][0]["expression"]
    assert {"kubernetes.io/metadata.name": "tools"} == leases["spec"]["matchConstraints"][
        "namespaceSelector"
    ]["matchLabels"]
    protection = policies["edge-resize-preemption-webhook-webhook-configurations"]["spec"]
    (service,) = [v for v in protection["variables"] if v["name"] == "service"]
    assert account in service["expression"]
    bindings = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert {name: name for name in policies} == {
        name: b["spec"]["policyName"] for name, b in bindings.items()
    }


# --- every service setting is a value ---------------------------------------------------


SETTING_CASES = [
    # (chart key, value, environment the service reads)
    ("mode", "warn", "warn"),
    ("evictionMethod", "delete", "delete"),
    ("pdbMode", "best-effort", "best-effort"),
    ("protectedNamespaces", ["kube-system", "monitoring"], "kube-system,monitoring"),
    ("unprotectedNamespaces", ["kube-system"], "kube-system"),
    ("preemptorNamespaceSelector", {"matchLabels": {"team": "a"}}, '{"matchLabels":{"team":"a"}}'),
    ("minPreemptorPriority", 1000, "1000"),
    ("minPreemptorPriority", -10, "-10"),
    ("maxVictims", 5, "5"),
    ("lending", False, "false"),
    ("lending", True, "true"),
    ("victimOrder", "movable-first", "movable-first"),
    ("reservationTTL", 90.5, "90.5"),
    ("gracePeriodCap", 30, "30"),
    ("persistTimeout", 4, "4"),
    ("leaseDuration", 20, "20"),
    ("resyncPeriod", 600, "600"),
    ("maxCacheStaleness", 20, "20"),
    ("maxBodyBytes", 1048576, "1048576"),
    ("schedulerName", "custom-scheduler", "custom-scheduler"),
]


@pytest.mark.parametrize(
    ("key", "value", "env"), SETTING_CASES, ids=[f"{c[0]}={c[2]}" for c in SETTING_CASES]
)
def test_a_setting_value_reaches_the_container_as_the_service_reads_it(
    key: str, value: Any, env: str
) -> None:
    setting = CHART_SETTINGS[key]
    rendered = env_of(render({f"settings.{key}": value}))
    assert env == rendered[env_name(setting)]
    # The service accepts what the chart wrote (the whole environment, as in the pod).
    load_config(env=rendered)


def test_unset_settings_are_left_to_the_service_defaults() -> None:
    assert {
        "RPW_MODE": "enforce",
        "RPW_EVICTION_METHOD": "evict",
        "RPW_PDB_MODE": "respect",
        "RPW_VICTIM_ORDER": "upstream",
        # The webhook configurations' selection, for the reconciler too.
        "RPW_PREEMPTOR_NAMESPACE_SELECTOR": '{"matchExpressions":[{"key":'
        '"kubernetes.io/metadata.name","operator":"NotIn",'
        '"values":["resize-preemption-system","kube-system"]}]}',
    } == env_of(render())


def test_server_options_become_flags() -> None:
    objects = render({"server.workers": 1, "server.logLevel": "debug"})
    args = deployment_of(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
    at = args.index("--workers")
    assert ["--workers", "1", "--log-level", "debug"] == args[at : at + 4]


@pytest.mark.parametrize(
    "values",
    [{}, {"server.workers": 2, "server.logLevel": "debug"}],
    ids=["defaults", "server-options"],
)
def test_the_container_command_is_one_the_service_accepts(values: dict[str, Any]) -> None:
    container = deployment_of(render(values))["spec"]["template"]["spec"]["containers"][0]
    command = [*container.get("command", []), *container["args"]]
    subcommand = command.index("serve")
    # argparse exits on a flag the service does not know.
    parsed = build_parser().parse_args(command[subcommand:])
    assert "serve" == parsed.command


# --- the values schema ------------------------------------------------------------------

GOOD_VALUES = [
    ("warn-mode", {"settings.mode": "warn"}),
    ("unlimited-victims", {"settings.maxVictims": None}),
    ("fail-policy", {"webhook.failurePolicy": "Fail"}),
    ("provided-with-ca", {"certificates.mode": "provided", "certificates.caBundle": "QUJD"}),
    ("one-replica", {"replicaCount": 1}),
    (
        "strict-spread",
        {
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                }
            ]
        },
    ),
    ("no-spread", {"topologySpreadConstraints": []}),
    ("critical-priority", {"priorityClassName": "system-cluster-critical"}),
    ("account-of-the-operator", {"serviceAccount.create": False, "serviceAccount.name": "rpw"}),
    ("openshift-ids", {"podSecurityContext.runAsUser": None, "securityContext.runAsUser": None}),
    (
        "extra-args-and-env",
        {"extraArgs": ["--log-level", "debug"], "extraEnv": [{"name": "A", "value": "1"}]},
    ),
    (
        "budget-as-percentage",
        {"podDisruptionBudget.minAvailable": None, "podDisruptionBudget.maxUnavailable": "50%"},
    ),
    ("pinned-digest", {"image.digest": "sha256:" + "0" * 64}),
    (
        "client-certificate-lifetime",
        {"clientAuth.duration": "17520h", "clientAuth.renewBefore": "1440h"},
    ),
    ("umbrella-global", {"global.imageRegistry": "registry.example"}),
    ("quantities", {"resources.limits.cpu": 1.5, "resources.requests.memory": "300Mi"}),
]


@pytest.mark.parametrize("values", [v for _, v in GOOD_VALUES], ids=[i for i, _ in GOOD_VALUES])
def test_good_values_render(values: dict[str, Any]) -> None:
    result = template(values)
    assert 0 == result.returncode, result.stderr


BAD_VALUES = [
    # (id, values, the line helm prints about them)
    ("unknown-mode", {"settings.mode": "audit"},
     "at '/settings/mode': value must be one of 'enforce', 'warn', 'deny-infeasible'"),
    ("negative-victims", {"settings.maxVictims": -1},
     "at '/settings/maxVictims': minimum: got -1, want 0"),
    ("victims-as-text", {"settings.maxVictims": "five"},
     "at '/settings/maxVictims': got string, want null or integer"),
    ("unknown-setting", {"settings.maxVictim": 3},
     "at '/settings': additional properties 'maxVictim' not allowed"),
    ("zero-lease", {"settings.leaseDuration": 0},
     "at '/settings/leaseDuration': minimum: got 0, want 1"),
    ("bad-namespace-name", {"settings.protectedNamespaces": ["Kube_System"]},
     "at '/settings/protectedNamespaces/0': 'Kube_System' does not match pattern"),
    ("zero-replicas", {"replicaCount": 0}, "at '/replicaCount': minimum: got 0, want 1"),
    ("unknown-failure-policy", {"webhook.failurePolicy": "Retry"},
     "at '/webhook/failurePolicy': value must be one of 'Ignore', 'Fail'"),
    ("timeout-too-long", {"webhook.timeoutSeconds": 31},
     "at '/webhook/timeoutSeconds': maximum: got 31, want 30"),
    ("unknown-certificates-mode", {"certificates.mode": "manual"},
     "at '/certificates/mode': value must be one of "
     "'service', 'cert-manager', 'self-signed', 'provided'"),
    ("digest-not-sha256", {"image.digest": "latest"},
     "at '/image/digest': 'latest' does not match pattern '^(sha256:[0-9a-f]{64})?$'"),
    ("provided-without-ca", {"certificates.mode": "provided"},
     "at '/certificates/caBundle': minLength: got 0, want 1"),
    ("ca-not-base64", {"certificates.mode": "provided", "certificates.caBundle": "not base64!"},
     "at '/certificates/caBundle': 'not base64!' does not match pattern"),
    ("bad-duration", {"certificates.duration": "90 days"},
     "at '/certificates/duration': '90 days' does not match pattern"),
    ("client-lifetime-in-years", {"clientAuth.duration": "1y"},
     "at '/clientAuth/duration': '1y' does not match pattern"),
    ("repository-with-tag-case", {"image.repository": "Registry.Example/You"},
     "at '/image/repository': 'Registry.Example/You' does not match pattern"),
    ("local-build-as-text", {"image.localBuild": "yes"},
     "at '/image/localBuild': got string, want boolean"),
    ("bad-port", {"server.port": 70000}, "at '/server/port': maximum: got 70,000, want 65,535"),
    ("zero-port", {"server.port": 0}, "at '/server/port': minimum: got 0, want 1"),
    ("zero-metrics-port", {"server.metricsPort": 0},
     "at '/server/metricsPort': minimum: got 0, want 1"),
    ("bad-log-level", {"server.logLevel": "verbose"},
     "at '/server/logLevel': value must be one of 'debug', 'info', 'warning', 'error'"),
    ("cpu-not-a-quantity", {"resources.limits.cpu": "lots"},
     "at '/resources/limits/cpu': 'lots' does not match pattern"),
    ("unknown-resources-key", {"resources.request.cpu": "1"},
     "at '/resources': additional properties 'request' not allowed"),
    ("old-spread-key", {"topologySpread": {"hostname": "DoNotSchedule"}},
     "at '': additional properties 'topologySpread' not allowed"),
    ("spread-without-key", {"topologySpreadConstraints": [{"maxSkew": 1}]},
     "at '/topologySpreadConstraints/0': missing properties 'topologyKey', 'whenUnsatisfiable'"),
    ("spread-unknown-policy", {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "k", "whenUnsatisfiable": "Maybe"}]},
     "at '/topologySpreadConstraints/0/whenUnsatisfiable': value must be one of"),
    ("tolerations-as-object", {"tolerations": {"key": "a"}},
     "at '/tolerations': got object, want array"),
    ("affinity-as-list", {"affinity": []}, "at '/affinity': got array, want object"),
    ("args-not-strings", {"extraArgs": [1]}, "at '/extraArgs/0': got number, want string"),
    ("args-as-string", {"extraArgs": "--log-level debug"},
     "at '/extraArgs': got string, want array"),
    ("env-without-name", {"extraEnv": [{"value": "1"}]},
     "at '/extraEnv/0': missing property 'name'"),
    ("env-as-map", {"extraEnv": {"A": "1"}}, "at '/extraEnv': got object, want array"),
    ("env-unknown-field", {"extraEnv": [{"name": "A", "values": "1"}]},
     "at '/extraEnv/0': additional properties 'values' not allowed"),
    ("env-number-value", {"extraEnv": [{"name": "A", "value": 1}]},
     "at '/extraEnv/0/value': got number, want string"),
    ("annotation-not-string", {"podAnnotations": {"a": 1}},
     "at '/podAnnotations/a': got number, want string"),
    ("label-not-string", {"podLabels": {"a": True}},
     "at '/podLabels/a': got boolean, want string"),
    ("account-name-not-dns", {"serviceAccount.name": "My_Account"},
     "at '/serviceAccount/name': 'My_Account' does not match pattern"),
    ("account-unknown-key", {"serviceAccount.automount": False},
     "at '/serviceAccount': additional properties 'automount' not allowed"),
    ("negative-user", {"securityContext.runAsUser": -1},
     "at '/securityContext/runAsUser': minimum: got -1, want 0"),
    ("user-as-name", {"podSecurityContext.runAsUser": "nobody"},
     "at '/podSecurityContext/runAsUser': got string, want null or integer"),
    ("budget-as-words", {"podDisruptionBudget.maxUnavailable": "half"},
     "at '/podDisruptionBudget/maxUnavailable'"),
    ("old-namespace-values", {"namespace.create": True},
     "at '': additional properties 'namespace' not allowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "message"), [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES]
)
def test_bad_values_are_refused_with_a_message_naming_the_value(
    values: dict[str, Any], message: str
) -> None:
    result = template(values)
    assert 0 != result.returncode
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


#: (chart key, value): a value the service refuses, which the schema refuses as well.
REFUSED_BY_BOTH = [
    ("maxBodyBytes", 0), ("maxBodyBytes", 65535), ("leaseDuration", 0), ("leaseDuration", 0.5),
    ("reservationTTL", 0), ("persistTimeout", -1), ("resyncPeriod", 0), ("maxCacheStaleness", 0),
    ("maxVictims", -1), ("gracePeriodCap", -1), ("gracePeriodCap", 1.5),
    ("protectedNamespaces", ["Bad_NS"]), ("schedulerName", ""), ("mode", "audit"),
    ("evictionMethod", "drain"), ("pdbMode", "ignore"), ("victimOrder", "random"),
    ("lending", "maybe"),
]  # fmt: skip
#: Values at the edge of a rule, which both take.
ACCEPTED_BY_BOTH = [
    ("maxBodyBytes", 65536), ("leaseDuration", 1), ("reservationTTL", 0.5), ("maxVictims", 0),
    ("gracePeriodCap", 0), ("persistTimeout", 0.1),
]  # fmt: skip


def as_the_chart_writes(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@pytest.mark.parametrize(
    ("key", "value"), REFUSED_BY_BOTH, ids=[f"{k}={v!r}" for k, v in REFUSED_BY_BOTH]
)
def test_the_schema_refuses_what_the_service_refuses(key: str, value: Any) -> None:
    variable = env_name(CHART_SETTINGS[key])
    with pytest.raises(InputError, match=variable):
        load_config(env={variable: as_the_chart_writes(value)})

    result = template({f"settings.{key}": value})

    assert 0 != result.returncode
    assert f"at '/settings/{key}" in result.stderr


@pytest.mark.parametrize(
    ("key", "value"), ACCEPTED_BY_BOTH, ids=[f"{k}={v!r}" for k, v in ACCEPTED_BY_BOTH]
)
def test_values_at_the_edge_of_a_rule_are_taken_by_both(key: str, value: Any) -> None:
    rendered = env_of(render({f"settings.{key}": value}))

    load_config(env=rendered)
    assert as_the_chart_writes(value) == rendered[env_name(CHART_SETTINGS[key])]


def test_a_metrics_port_equal_to_the_port_is_refused_by_the_template() -> None:
    result = template({"server.port": 9090, "server.metricsPort": 9090})

    assert 0 != result.returncode
    assert "server.metricsPort (9090) must differ from server.port" in result.stderr


# --- the PodDisruptionBudget ------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "budgets"), [(1, 0), (2, 1), (3, 1)], ids=["one", "two", "three"]
)
def test_one_replica_gets_no_budget_that_would_block_every_drain(
    replicas: int, budgets: int
) -> None:
    objects = render({"replicaCount": replicas})
    found = [o for o in objects if o["kind"] == "PodDisruptionBudget"]

    assert budgets == len(found)
    if found:
        assert 1 == found[0]["spec"]["minAvailable"]
        assert replicas == deployment_of(objects)["spec"]["replicas"]


@pytest.mark.parametrize(
    ("values", "spec"),
    [
        ({}, {"minAvailable": 1}),
        ({"podDisruptionBudget.minAvailable": None, "podDisruptionBudget.maxUnavailable": 1},
         {"maxUnavailable": 1}),
        ({"podDisruptionBudget.minAvailable": "50%"}, {"minAvailable": "50%"}),
    ],
    ids=["default", "max-unavailable", "percentage"],
)  # fmt: skip
def test_the_budget_is_min_available_or_max_unavailable(
    values: dict[str, Any], spec: dict[str, Any]
) -> None:
    (budget,) = [o for o in render(values) if o["kind"] == "PodDisruptionBudget"]
    assert spec == {k: v for k, v in budget["spec"].items() if k != "selector"}


@pytest.mark.parametrize(
    "values",
    [{"podDisruptionBudget.maxUnavailable": 1}, {"podDisruptionBudget.minAvailable": None}],
    ids=["both", "neither"],
)
def test_the_budget_takes_exactly_one_of_them(values: dict[str, Any]) -> None:
    result = template(values)
    assert 0 != result.returncode
    assert (
        "podDisruptionBudget: set exactly one of minAvailable and maxUnavailable, the other null"
        in result.stderr
    )


# --- the pod's values -------------------------------------------------------------------


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment_of(objects)["spec"]["template"]["spec"]
    return spec


HARDENED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
HARDENED_CONTAINER = {
    "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}  # fmt: skip


@pytest.mark.parametrize(
    ("values", "pod", "container"),
    [
        ({}, HARDENED_POD, HARDENED_CONTAINER),
        ({"podSecurityContext.runAsUser": 1000, "securityContext.runAsUser": 1000},
         {**HARDENED_POD, "runAsUser": 1000}, {**HARDENED_CONTAINER, "runAsUser": 1000}),
        # OpenShift's restricted-v2 assigns the ids from the namespace's range.
        ({"podSecurityContext.runAsUser": None, "podSecurityContext.runAsGroup": None,
          "podSecurityContext.fsGroup": None, "securityContext.runAsUser": None,
          "securityContext.runAsGroup": None},
         {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
         {k: v for k, v in HARDENED_CONTAINER.items() if k not in ("runAsUser", "runAsGroup")}),
    ],
    ids=["hardened-default", "other-user", "ids-unset"],
)  # fmt: skip
def test_security_contexts_are_values_with_the_hardened_default(
    values: dict[str, Any], pod: dict[str, Any], container: dict[str, Any]
) -> None:
    spec = pod_of(render(values))
    assert pod == spec["securityContext"]
    assert container == spec["containers"][0]["securityContext"]


@pytest.mark.parametrize(
    ("values", "account", "created", "annotations"),
    [
        ({}, NAME, True, None),
        ({"serviceAccount.name": "webhook-sa",
          "serviceAccount.annotations": {"iam.gke.io/gcp-service-account": "a@b.iam"}},
         "webhook-sa", True, {"iam.gke.io/gcp-service-account": "a@b.iam"}),
        ({"serviceAccount.create": False, "serviceAccount.name": "theirs"}, "theirs", False, None),
    ],
    ids=["default", "named-annotated", "operators-own"],
)  # fmt: skip
def test_the_service_account_is_a_value_and_every_right_and_policy_follows_it(
    values: dict[str, Any], account: str, created: bool, annotations: dict[str, str] | None
) -> None:
    objects = render({**values, "settings.evictionMethod": "delete"})
    accounts = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert ([account] if created else []) == [a["metadata"]["name"] for a in accounts]
    if created:
        assert annotations == accounts[0]["metadata"].get("annotations")
    assert account == pod_of(objects)["serviceAccountName"]
    bindings = [o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) >= 4
    for binding in bindings:
        assert [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}] == (
            binding["subjects"]
        )
    username = f"'system:serviceaccount:{NAMESPACE}:{account}'"
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    assert len(policies) >= 3
    for policy in policies.values():
        assert username in json.dumps(policy["spec"]), policy["metadata"]["name"]


def test_extra_args_and_env_come_after_the_charts_own() -> None:
    extra_env = [
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}},
    ]
    container = pod_of(render({"extraArgs": ["--log-level", "debug"], "extraEnv": extra_env}))[
        "containers"
    ][0]
    assert ["--log-level", "debug"] == container["args"][-2:]
    assert extra_env == container["env"][-2:]
    assert "POD_IP" == container["env"][-3]["name"]


def test_pod_annotations_labels_affinity_and_tolerations_reach_the_pod() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["system"]}]}]}}}  # fmt: skip
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "system",
                    "effect": "NoSchedule"}]  # fmt: skip
    objects = render({
        "podAnnotations": {"a": "1"}, "podLabels": {"team": "platform"},
        "affinity": affinity, "tolerations": tolerations,
    })  # fmt: skip
    template_ = deployment_of(objects)["spec"]["template"]
    assert {"a": "1"} == template_["metadata"]["annotations"]
    assert "platform" == template_["metadata"]["labels"]["team"]
    assert (affinity, tolerations) == (
        template_["spec"]["affinity"],
        template_["spec"]["tolerations"],
    )
    selector = deployment_of(objects)["spec"]["selector"]["matchLabels"]
    assert "team" not in selector


@pytest.mark.parametrize(
    ("values", "priority"),
    [({}, None), ({"priorityClassName": "system-cluster-critical"}, "system-cluster-critical")],
    ids=["none-by-default", "critical-when-asked"],
)
def test_the_priority_class_is_empty_unless_asked(
    values: dict[str, Any], priority: str | None
) -> None:
    assert priority == pod_of(render(values)).get("priorityClassName")


def test_spread_constraints_are_a_list_whose_entries_get_the_pods_selector() -> None:
    own = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
           "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "other"}}}  # fmt: skip
    given = [{"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}, own]
    spread = pod_of(render({"topologySpreadConstraints": given}))["topologySpreadConstraints"]
    selector = {"matchLabels": {"app.kubernetes.io/name": NAME,
                                "app.kubernetes.io/component": "admission-webhook"}}  # fmt: skip
    assert [
        {**given[0], "labelSelector": selector, "matchLabelKeys": ["pod-template-hash"]},
        own,
    ] == spread
    assert "topologySpreadConstraints" not in pod_of(render({"topologySpreadConstraints": []}))


def test_the_webhook_port_can_be_one_a_private_control_plane_reaches() -> None:
    objects = render({"server.port": 10250})
    (port,) = [p for p in pod_of(objects)["containers"][0]["ports"] if p["name"] == "https"]
    assert 10250 == port["containerPort"]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (https,) = [p for p in service["spec"]["ports"] if p["name"] == "https"]
    assert (443, "https") == (https["port"], https["targetPort"])


# --- monitoring objects -----------------------------------------------------------------


def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {o["kind"] for o in render()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "ConfigMap"}


def test_prometheus_rule_holds_the_rules_file_and_the_dashboard_the_json_file() -> None:
    objects = render(
        {"metrics.prometheusRule.enabled": True, "metrics.dashboard.enabled": True,
         "metrics.serviceMonitor.enabled": True}
    )  # fmt: skip
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert yaml.safe_load(RULES.read_text()) == rule["spec"]
    (dashboard,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert "1" == dashboard["metadata"]["labels"]["grafana_dashboard"]
    assert json.loads(DASHBOARD.read_text()) == json.loads(
        dashboard["data"]["resize-preemption-webhook.json"]
    )
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert [{"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "30s"}] == (
        monitor["spec"]["endpoints"]
    )
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # By default the metrics port listens on the pod's IP, which the Service's endpoints
    # (and so the ServiceMonitor's scrapes) address.
    assert "$(POD_IP)" == container["args"][container["args"].index("--metrics-host") + 1]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    assert service["spec"]["selector"] == monitor["spec"]["selector"]["matchLabels"]


BASE = "https://git.example.com/platform/rpw/blob/v0.1.0/docs/operations.md"


@pytest.mark.parametrize(
    ("base", "prefix"), [("", "docs/operations.md#"), (BASE, f"{BASE}#")], ids=["path", "base"]
)
def test_every_alert_links_its_runbook_where_the_docs_are_published(base: str, prefix: str) -> None:
    objects = render(
        {"metrics.prometheusRule.enabled": True, "metrics.prometheusRule.runbookBaseURL": base}
    )  # fmt: skip
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 12
    for alert in alerts:
        assert f"{prefix}{alert['alert'].lower()}" == alert["annotations"]["runbook_url"]


def test_a_runbook_base_that_is_no_address_is_refused() -> None:
    result = template({"metrics.prometheusRule.runbookBaseURL": "docs/operations.md#x"})
    assert 0 != result.returncode
    assert "at '/metrics/prometheusRule/runbookBaseURL'" in result.stderr


def test_plain_files_under_deploy_prometheus_are_the_charts() -> None:
    for name, source in (("rules.yaml", RULES), ("dashboard.json", DASHBOARD)):
        assert source.read_bytes() == (DEPLOY / "prometheus" / name).read_bytes()


# --- the image and the service's own certificates (the default mode) ----------------------

DIGEST = "sha256:" + "ab" * 32
IMAGES = [
    ("local-build", {}, "localhost/resize-preemption-webhook:0.1.0"),
    ("repository-and-tag", {"image.repository": "registry.example.com/you/rpw",
                            "image.tag": "1.2.3"}, "registry.example.com/you/rpw:1.2.3"),
    ("digest", {"image.digest": DIGEST}, f"localhost/resize-preemption-webhook:0.1.0@{DIGEST}"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "image"), [i[1:] for i in IMAGES], ids=[i[0] for i in IMAGES])
def test_the_image_is_fully_qualified_and_may_be_pinned(values: dict[str, Any], image: str) -> None:
    container = deployment_of(render(values))["spec"]["template"]["spec"]["containers"][0]
    assert image == container["image"]


UNPUBLISHED = (
    "image.repository is not set and no image is published: push the image `make image` "
    "builds and --set image.repository=<your registry>/resize-preemption-webhook, or --set "
    "image.localBuild=true where every node has localhost/resize-preemption-webhook "
    '(docs/deploy.md "The image")'
)


@pytest.mark.parametrize("command", ["template", "install"])
def test_the_unpublished_default_image_fails_the_install_at_once_in_one_line(
    command: str,
) -> None:
    extra = ["--dry-run=client"] if command == "install" else ["--kube-version", "1.37.2"]
    result = helm(command, "rpw", str(CHART), "--namespace", NAMESPACE, *extra)
    assert 0 != result.returncode
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("Error:")]
    assert line.endswith(UNPUBLISHED), line


@pytest.mark.parametrize(
    "values",
    [{"image.repository": "registry.example.com/you/rpw"}, {"image.localBuild": True}],
    ids=["pushed", "acknowledged-local-build"],
)
def test_an_image_reference_or_the_acknowledgement_installs(values: dict[str, Any]) -> None:
    result = helm(
        "install", "rpw", str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
        *set_args(values),
    )  # fmt: skip
    assert 0 == result.returncode, result.stderr


def test_the_notes_say_how_to_build_and_load_the_local_image() -> None:
    result = helm(
        "install", "rpw", str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
        *set_args(LOCAL_BUILD),
    )  # fmt: skip
    notes = result.stdout.split("\nNOTES:\n", 1)[1]
    assert "make image IMAGE=localhost/resize-preemption-webhook:0.1.0" in notes
    assert "kind load docker-image localhost/resize-preemption-webhook:0.1.0" in notes
    pushed = helm(
        "install", "rpw", str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
        *set_args({"image.repository": "registry.example.com/you/rpw"}),
    )  # fmt: skip
    assert "make image" not in pushed.stdout.split("\nNOTES:\n", 1)[1]


def _rules(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    role = next(
        o for o in objects if o["kind"] == kind and not o["metadata"]["name"].endswith("-viewer")
    )
    return [r for r in role["rules"] if "resourceNames" in r]


def test_the_service_mode_grants_its_secret_and_webhooks_by_name_and_renders_no_cert() -> None:
    objects = render()
    assert [{"apiGroups": ["admissionregistration.k8s.io"],
             "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
             "resourceNames": ["resize-preemption-webhook"],
             "verbs": ["get", "patch"]}] == _rules(objects, "ClusterRole")  # fmt: skip
    assert [{"apiGroups": [""], "resources": ["secrets"],
             "resourceNames": ["resize-preemption-webhook-tls"],
             "verbs": ["get", "update"]}] == _rules(objects, "Role")  # fmt: skip
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert ("Opaque", None) == (secret["type"], secret.get("data"))
    config = next(o for o in objects if o["kind"] == "ValidatingWebhookConfiguration")
    assert None is config["webhooks"][0]["clientConfig"].get("caBundle")
    spec = deployment_of(objects)["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    at = args.index("--tls-secret")
    assert ["--tls-secret", "resize-preemption-webhook-tls"] == args[at : at + 2]
    assert {"medium": "Memory", "sizeLimit": "1Mi"} == next(
        v for v in spec["volumes"] if v["name"] == "tls"
    )["emptyDir"]


@pytest.mark.parametrize("mode", ["cert-manager", "self-signed", "provided"])
def test_other_certificate_modes_grant_nothing_on_secrets_or_webhooks(mode: str) -> None:
    values = {"certificates.mode": mode, "certificates.caBundle": "QUJD"}
    objects = render(values)
    assert ([], []) == (_rules(objects, "ClusterRole"), _rules(objects, "Role"))
    assert (
        "--tls-secret"
        not in deployment_of(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
    )


# --- clientAuth: kube-apiserver's client certificate -------------------------------------


def _client_auth(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "client-ca"]
    return container, volume


@pytest.mark.parametrize(
    ("values", "issued_kind"),
    [
        ({"certificates.mode": "cert-manager"}, "Certificate"),
        ({"certificates.mode": "self-signed"}, "Secret"),
        (
            {
                "certificates.mode": "provided",
                "certificates.caBundle": "eA==",
                "clientAuth.caBundle": "-----BEGIN CERTIFICATE-----",
            },
            "ConfigMap",
        ),
    ],
    ids=["cert-manager", "self-signed", "provided-with-a-ca"],
)
def test_client_auth_requires_the_api_servers_certificate_and_probes_apart(
    values: dict[str, Any], issued_kind: str
) -> None:
    objects = render({**values, "clientAuth.enabled": True})
    container, volume = _client_auth(objects)
    args = container["args"]
    assert "/etc/rpw/client-ca/ca.crt" == args[args.index("--client-ca") + 1]
    assert "8444" == args[args.index("--probe-port") + 1]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert "probes" == container[probe]["httpGet"]["port"]
    issued = [
        o
        for o in objects
        if o["kind"] == issued_kind
        and o["metadata"]["name"].endswith(("-apiserver-client", "-client-ca"))
    ]
    assert 1 == len(issued)
    if issued_kind == "ConfigMap":
        assert issued[0]["metadata"]["name"] == volume["configMap"]["name"]
    else:
        # Only the CA reaches the service; the client's key stays in the Secret.
        assert [{"key": "ca.crt", "path": "ca.crt"}] == volume["secret"]["items"]
        assert issued[0]["metadata"]["name"] == volume["secret"]["secretName"]


def test_a_self_signed_client_certificate_is_for_client_auth_signed_by_the_ca_it_names() -> None:
    objects = render({"certificates.mode": "self-signed", "clientAuth.enabled": True})
    (secret,) = [o for o in objects if o["metadata"]["name"].endswith("-apiserver-client")]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert ca.subject == cert.issuer
    cert.verify_directly_issued_by(ca)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    # The name the review port asks for (clientAuth.commonName, passed as --client-cn).
    (name,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert "kube-apiserver" == name.value
    args = deployment_of(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "kube-apiserver" == args[args.index("--client-cn") + 1]


CLIENT_SECRET = f"{NAME}-apiserver-client"


def test_client_auth_in_service_mode_has_the_service_keep_the_certificate() -> None:
    """No ``fail``: the service makes and renews kube-apiserver's client certificate in
    the chart's empty Secret, may get and update it by name, and writes its CA into the
    file ``--client-ca`` names (an in-memory emptyDir, not a Secret volume)."""
    objects = render({"clientAuth.enabled": True, "clientAuth.duration": "4380h"})
    container, volume = _client_auth(objects)
    args = container["args"]
    at = args.index("--tls-client-secret")
    assert ["--tls-client-secret", CLIENT_SECRET, "--tls-client-validity", "4380h",
            "--tls-client-renew-before", "720h"] == args[at : at + 6]  # fmt: skip
    assert "/etc/rpw/client-ca/ca.crt" == args[args.index("--client-ca") + 1]
    assert {"medium": "Memory", "sizeLimit": "1Mi"} == volume["emptyDir"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "client-ca"]
    assert False is mount["readOnly"]
    (secret,) = [o for o in objects if o["metadata"]["name"] == CLIENT_SECRET]
    assert ("Secret", "Opaque", None) == (secret["kind"], secret["type"], secret.get("data"))
    assert [{"apiGroups": [""], "resources": ["secrets"],
             "resourceNames": [f"{NAME}-tls", CLIENT_SECRET],
             "verbs": ["get", "update"]}] == _rules(objects, "Role")  # fmt: skip
    command = [*container.get("command", []), *args]
    parsed = build_parser().parse_args(command[command.index("serve") :])
    managed = _managed_tls(parsed, NAMESPACE, parsed.client_ca)
    assert (CLIENT_SECRET, "/etc/rpw/client-ca/ca.crt", 4380) == (
        managed.client.secret,
        managed.client.ca_file,
        managed.client.policy.validity.total_seconds() / 3600,
    )


def test_client_auth_in_service_mode_with_the_operators_ca_keeps_no_certificate() -> None:
    objects = render({"clientAuth.enabled": True, "clientAuth.caBundle": "-----BEGIN"})
    container, volume = _client_auth(objects)
    assert "--tls-client-secret" not in container["args"]
    assert f"{NAME}-client-ca" == volume["configMap"]["name"]
    assert [] == [o for o in objects if o["metadata"]["name"] == CLIENT_SECRET]
    assert [[f"{NAME}-tls"]] == [r["resourceNames"] for r in _rules(objects, "Role")]


def test_without_client_auth_the_service_mode_keeps_no_client_certificate() -> None:
    objects = render()
    args = deployment_of(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--tls-client-secret" in args, "--client-ca" in args) == (False, False)
    assert [] == [o for o in objects if o["metadata"]["name"] == CLIENT_SECRET]


NOTES_MODES = [
    ("service", True),
    ("cert-manager", True),
    ("self-signed", False),
]


@pytest.mark.parametrize(("mode", "renews"), NOTES_MODES, ids=[m[0] for m in NOTES_MODES])
def test_the_notes_say_how_to_give_kube_apiserver_its_certificate(mode: str, renews: bool) -> None:
    # NOTES.txt is rendered by install, not by template; --dry-run=client needs no cluster.
    result = helm(
        "install", "rpw", str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
        *set_args({**LOCAL_BUILD, "clientAuth.enabled": True, "certificates.mode": mode}),
    )  # fmt: skip
    assert 0 == result.returncode, result.stderr
    notes = result.stdout.split("\nNOTES:\n", 1)[1]
    secret = "rpw-resize-preemption-webhook-apiserver-client"
    for key in ("crt", "key"):
        assert (
            f"kubectl -n {NAMESPACE} get secret {secret} -o jsonpath='{{.data.tls\\.{key}}}' "
            f"| base64 -d > /etc/kubernetes/admission/webhook-client.{key}"
        ) in notes
    assert '"rpw-resize-preemption-webhook.resize-preemption-system.svc"' in notes
    assert "kubectl annotate validatingwebhookconfiguration rpw-resize-preemption-webhook" in notes
    assert renews == ("Copy the files again after each renewal (720h" in notes)


def test_client_auth_with_provided_certificates_needs_the_clients_ca() -> None:
    result = template(
        {
            "certificates.mode": "provided",
            "certificates.caBundle": "eA==",
            "clientAuth.enabled": True,
        }
    )
    assert 0 != result.returncode
    assert "needs clientAuth.caBundle" in result.stderr


def test_the_metrics_port_can_bind_the_pod_ip_and_serve_tls() -> None:
    (deployment,) = [
        o
        for o in render({"server.metricsOnPodIP": True, "server.metricsTLS": True})
        if o["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "$(POD_IP)" == args[args.index("--metrics-host") + 1]
    assert "--metrics-tls" in args
    (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert {"fieldRef": {"fieldPath": "status.podIP"}} == pod_ip["valueFrom"]


def test_a_service_monitor_scrapes_tls_metrics_verifying_the_serving_ca() -> None:
    objects = render({"server.metricsTLS": True, "metrics.serviceMonitor.enabled": True})
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert "https" == endpoint["scheme"]
    name = monitor["metadata"]["name"]
    namespace = monitor["metadata"]["namespace"]
    assert {
        "serverName": f"{name}.{namespace}.svc",
        "ca": {"secret": {"name": f"{name}-tls", "key": "ca.crt"}},
    } == endpoint["tlsConfig"]


def test_the_metrics_port_on_every_address_is_a_choice() -> None:
    (deployment,) = [
        o for o in render({"server.metricsOnPodIP": False}) if o["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--metrics-host" not in container["args"]
    assert "POD_IP" not in {e["name"] for e in container["env"]}
