"""deploy/helm/resize-preemption-webhook with the real helm: lint, the values schema (good
and bad values), and the one-source-of-truth check - the chart's default objects equal
`kubectl kustomize deploy/overlays/cert-manager`, with the mutating component too, and the
"provided" certificates mode equals the self-signed overlay minus its Secret. Helm's own
labels (tests/unit/helm_tools.HELM_LABELS) are the only difference allowed."""

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
from cryptography.x509.oid import ExtendedKeyUsageOID

from harness.binaries import ensure_binaries
from tests.unit.helm_tools import (
    CHART,
    REPO,
    by_key,
    helm,
    render,
    template,
    without_helm_labels,
)
from webhook.cli import build_parser
from webhook.engine.settings import SETTINGS, env_name, load_config

DEPLOY = REPO / "deploy"
NAMESPACE = "resize-preemption-system"
NAME = "resize-preemption-webhook"
RULES = CHART / "files" / "rules.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"

#: settings key of the chart -> service setting (namespace and identity come from the pod).
CHART_SETTINGS = {
    "mode": "mode",
    "evictionMethod": "eviction-method",
    "pdbMode": "pdb-mode",
    "protectedNamespaces": "protected-namespaces",
    "maxVictims": "max-victims",
    "lending": "lending",
    "victimOrder": "victim-order",
    "reservationTTL": "reservation-ttl",
    "gracePeriodCap": "grace-period-cap",
    "persistTimeout": "persist-timeout",
    "leaseDuration": "lease-duration",
    "resyncPeriod": "resync-period",
    "maxCacheStaleness": "max-cache-staleness",
    "maxBodyBytes": "max-body-bytes",
    "schedulerName": "scheduler-name",
}
FROM_THE_POD = {"namespace", "identity", "memory-limit"}
#: Set by clientAuth, with the files the chart mounts.
FROM_CLIENT_AUTH = {"client-ca"}


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
    want = by_key(expected)
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
    ],
    ids=["defaults", "self-signed-with-mutating", "monitoring"],
)
def test_helm_lint_is_clean(values: dict[str, Any]) -> None:
    args = [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
    result = helm("lint", "--strict", str(CHART), "--kube-version", "1.37.2", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# --- one source of truth: the chart renders what kustomize builds -----------------------


def test_default_values_render_the_cert_manager_overlay() -> None:
    assert_same_objects(kustomize(DEPLOY / "overlays" / "cert-manager"), render())


def test_mutating_enabled_renders_the_overlay_with_the_mutating_component(
    deploy_copy: Path,
) -> None:
    overlay = deploy_copy / "overlays" / "cert-manager"
    enable_mutating(overlay)
    assert_same_objects(kustomize(overlay), render({"mutating.enabled": True}))


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


def test_release_name_and_namespace_name_every_object() -> None:
    objects = render({"namespace.name": "", "namespace.create": False},
                     release="edge", extra=["--namespace", "tools"])  # fmt: skip
    assert not [o for o in objects if o["kind"] == "Namespace"]
    for obj in objects:
        assert obj["metadata"]["name"].startswith("edge-resize-preemption-webhook")
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding") and not obj["kind"].endswith(
            "WebhookConfiguration"
        ):
            assert "tools" == obj["metadata"]["namespace"], obj["kind"]
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    webhook = config["webhooks"][0]
    service = {"name": "edge-resize-preemption-webhook", "namespace": "tools",
               "path": "/validate-resize", "port": 443}  # fmt: skip
    assert service == webhook["clientConfig"]["service"]
    assert ["tools"] == webhook["namespaceSelector"]["matchExpressions"][0]["values"]


# --- every service setting is a value ---------------------------------------------------


def test_every_service_setting_is_a_chart_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(CHART_SETTINGS) == set(values["settings"])
    assert set(SETTINGS) - FROM_THE_POD - FROM_CLIENT_AUTH == set(CHART_SETTINGS.values())


SETTING_CASES = [
    # (chart key, value, environment the service reads)
    ("mode", "warn", "warn"),
    ("evictionMethod", "delete", "delete"),
    ("pdbMode", "best-effort", "best-effort"),
    ("protectedNamespaces", ["kube-system", "monitoring"], "kube-system,monitoring"),
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
    } == env_of(render())


def test_server_options_become_flags() -> None:
    objects = render({"server.workers": 1, "server.logLevel": "debug"})
    args = deployment_of(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ["--workers", "1", "--log-level", "debug"] == args[-4:]


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
    ("strict-spread", {"topologySpread.hostname": "DoNotSchedule"}),
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
     "at '/settings/leaseDuration': exclusiveMinimum: got 0, want 0"),
    ("bad-namespace-name", {"settings.protectedNamespaces": ["Kube_System"]},
     "at '/settings/protectedNamespaces/0': 'Kube_System' does not match pattern"),
    ("zero-replicas", {"replicaCount": 0}, "at '/replicaCount': minimum: got 0, want 1"),
    ("unknown-failure-policy", {"webhook.failurePolicy": "Retry"},
     "at '/webhook/failurePolicy': value must be one of 'Ignore', 'Fail'"),
    ("timeout-too-long", {"webhook.timeoutSeconds": 31},
     "at '/webhook/timeoutSeconds': maximum: got 31, want 30"),
    ("unknown-certificates-mode", {"certificates.mode": "manual"},
     "at '/certificates/mode': value must be one of 'cert-manager', 'self-signed', 'provided'"),
    ("provided-without-ca", {"certificates.mode": "provided"},
     "at '/certificates/caBundle': minLength: got 0, want 1"),
    ("ca-not-base64", {"certificates.mode": "provided", "certificates.caBundle": "not base64!"},
     "at '/certificates/caBundle': 'not base64!' does not match pattern"),
    ("bad-duration", {"certificates.duration": "90 days"},
     "at '/certificates/duration': '90 days' does not match pattern"),
    ("bad-port", {"server.port": 70000}, "at '/server/port': maximum: got 70,000, want 65,535"),
    ("bad-log-level", {"server.logLevel": "verbose"},
     "at '/server/logLevel': value must be one of 'debug', 'info', 'warning', 'error'"),
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
    (service,) = [o for o in objects if o["kind"] == "Service"]
    assert service["spec"]["selector"] == monitor["spec"]["selector"]["matchLabels"]


def test_plain_files_under_deploy_prometheus_are_the_charts() -> None:
    for name, source in (("rules.yaml", RULES), ("dashboard.json", DASHBOARD)):
        assert source.read_bytes() == (DEPLOY / "prometheus" / name).read_bytes()


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
