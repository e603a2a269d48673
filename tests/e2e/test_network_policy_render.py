"""The NetworkPolicy of deploy/: the kustomize component and the chart's value render the
same object, it admits the webhook port only from the API server's addresses and the
metrics port only from Prometheus, and it is off unless asked for.

Runs helm (built from the Go module proxy by scripts/build-tools.sh on first use, then
cached) and ``kubectl kustomize`` (the control-plane binaries of
scripts/build-control-plane.sh); no cluster."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.helm_tools import REPO, render, template
from tests.e2e.test_helm_chart import assert_same_objects, kustomize

pytestmark = pytest.mark.e2e

DEPLOY = REPO / "deploy"
COMPONENT = DEPLOY / "components" / "network-policy"
#: The component's placeholder (RFC 5737): no API server uses it.
PLACEHOLDER = "192.0.2.0/24"
ENABLED = {"networkPolicy.enabled": True, "networkPolicy.apiServerCIDRs": [PLACEHOLDER]}


def policy_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    return policy


@pytest.fixture
def overlay_with_policy(tmp_path: Path) -> Path:
    target = tmp_path / "deploy"
    shutil.copytree(DEPLOY, target, ignore=shutil.ignore_patterns("tls", "helm", "prometheus"))
    overlay = target / "overlays" / "cert-manager"
    path = overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["components"] = ["../../components/network-policy"]
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return overlay


def test_chart_value_renders_the_overlay_with_the_component(overlay_with_policy: Path) -> None:
    assert_same_objects(
        kustomize(overlay_with_policy), render({**ENABLED, "certificates.mode": "cert-manager"})
    )


def test_off_by_default_in_the_chart_and_the_overlays() -> None:
    assert [] == [o for o in render() if o["kind"] == "NetworkPolicy"]
    for overlay in ("cert-manager", "self-signed"):
        kustomization = yaml.safe_load(
            (DEPLOY / "overlays" / overlay / "kustomization.yaml").read_text()
        )
        assert "../../components/network-policy" not in kustomization.get("components", [])


def test_only_the_api_server_reaches_the_webhook_port_and_prometheus_the_metrics_port() -> None:
    objects = render(ENABLED)
    policy = policy_of(objects)
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    spec = policy["spec"]
    assert service["spec"]["selector"] == spec["podSelector"]["matchLabels"]
    assert ["Ingress"] == spec["policyTypes"]
    reviews, metrics = spec["ingress"]
    assert [{"ipBlock": {"cidr": PLACEHOLDER}}] == reviews["from"]
    assert [{"protocol": "TCP", "port": "https"}] == reviews["ports"]
    assert [{"protocol": "TCP", "port": "metrics"}] == metrics["ports"]
    assert {"https", "metrics"} <= ports
    (peer,) = metrics["from"]
    assert {"kubernetes.io/metadata.name": "monitoring"} == peer["namespaceSelector"]["matchLabels"]


def test_several_addresses_and_no_metrics_peers() -> None:
    values = {
        "networkPolicy.enabled": True,
        "networkPolicy.apiServerCIDRs": ["10.0.0.10/32", "fd00::10/128"],
        "networkPolicy.metricsFrom": [],
    }
    (reviews,) = policy_of(render(values))["spec"]["ingress"]
    expected = [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "fd00::10/128"}}]
    assert expected == reviews["from"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"networkPolicy.enabled": True},
            "at '/networkPolicy/apiServerCIDRs': minItems: got 0, want 1",
        ),
        (
            {"networkPolicy.enabled": True, "networkPolicy.apiServerCIDRs": ["10.0.0.10"]},
            "at '/networkPolicy/apiServerCIDRs/0': '10.0.0.10' does not match pattern",
        ),
    ],
    ids=["enabled-without-addresses", "address-without-prefix"],
)
def test_bad_values_are_refused(values: dict[str, Any], message: str) -> None:
    result = template(values)
    assert 0 != result.returncode
    assert message in result.stderr, result.stderr
