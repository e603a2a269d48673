"""The NetworkPolicy of deploy/ passes the real API server's validation (named ports,
peers, the ipBlock), from the kustomize component and from the chart. What it blocks is
not tested: the local cluster runs no network plugin that enforces NetworkPolicy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.webhook_process import ensure_namespace
from tests.e2e.conftest import Cluster, Kubectl
from tests.e2e.helm_tools import template
from tests.e2e.test_deploy import DEPLOY, build, documents, server_dry_run

NAMESPACE = "resize-preemption-system"


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Kubectl:
    ensure_namespace(cluster.client, NAMESPACE)
    return Kubectl(cluster.binaries.kubectl, cluster.kubeconfig)


def policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert 1 == len(found)
    return found


def test_the_component_passes_server_dry_run(admin: Kubectl, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "base", tmp_path)],
                "components": [os.path.relpath(DEPLOY / "components" / "network-policy", tmp_path)],
            }
        )
    )
    server_dry_run(admin, policies(build(admin, tmp_path)))


def test_the_charts_policy_passes_server_dry_run(admin: Kubectl) -> None:
    values = {
        "networkPolicy.enabled": True,
        "networkPolicy.apiServerCIDRs": ["10.0.0.10/32", "fd00::10/128"],
    }
    result = template(values)
    assert 0 == result.returncode, result.stderr
    server_dry_run(admin, policies(documents(result.stdout)))
