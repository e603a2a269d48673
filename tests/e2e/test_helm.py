"""The chart with the real helm against the local kube-apiserver: install, a walkthrough
with the webhook process run as the chart configures it, upgrade (a changed value reaches
the Deployment, the certificates stay), uninstall (the webhook configurations go first,
nothing of the release is left); and the move from a chart that made its own namespace,
docs/deploy.md's block run as written.

The local nodes run no containers (no Deployment controller either), so the walkthrough
starts ``python -m webhook serve`` itself: with the container's arguments, the settings of
its environment, the Secret's certificate and key, and the installed
ValidatingWebhookConfiguration pointed at it by URL (its caBundle as Helm made it)."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.binaries import REPO_ROOT
from harness.kubeapi import ApiError
from harness.launcher import free_port
from harness.webhook_process import launch
from tests.e2e.conftest import Cluster, Kubectl, Waiter, _remove_namespace
from tests.e2e.helm_tools import CHART, helm_binary, set_args
from tests.e2e.service_support import account_kubeconfig, resize
from tests.e2e.test_service import expect_preempted_and_actuated, walkthrough

pytestmark = pytest.mark.e2e

#: The release name the docs install.
RELEASE = "rpw"
FULLNAME = f"{RELEASE}-resize-preemption-webhook"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
#: The contract the harness's launcher speaks: the container's arguments must be it.
CONTAINER_ARGS = [
    "serve", "--tls-cert", "/etc/rpw/tls/tls.crt", "--tls-key", "/etc/rpw/tls/tls.key",
    "--port", "8443", "--metrics-port", "9090", "--workers", "2",
    "--metrics-host", "$(POD_IP)",
]  # fmt: skip


class Helm:
    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        self.namespace = namespace

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(helm_binary()), "--namespace", self.namespace, *args],
            capture_output=True,
            text=True,
            timeout=180,
            env=self.env,
            check=False,
        )
        if check:
            assert 0 == result.returncode, f"helm {' '.join(args)}:\n{result.stderr}"
        return result


@pytest.fixture
def release_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"rpw-helm-{secrets.token_hex(3)}"
    cluster.client.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    _remove_namespace(cluster, name)


@pytest.fixture
def helm(cluster: Cluster, release_namespace: str) -> Iterator[Helm]:
    run = Helm(cluster, release_namespace)
    yield run
    # Whatever the test's outcome, no release is left: its Deployment's pods land on the
    # session's nodes and its webhook configurations are cluster-wide, so the tests after
    # it would meet them.
    run("uninstall", RELEASE, "--ignore-not-found", check=False)


def get(cluster: Cluster, path: str) -> dict[str, Any] | None:
    try:
        return cluster.client.get(path)
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def deployment(cluster: Cluster, namespace: str) -> dict[str, Any]:
    found = get(cluster, f"/apis/apps/v1/namespaces/{namespace}/deployments/{FULLNAME}")
    assert found is not None
    return found


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def setting_flags(container: dict[str, Any]) -> list[str]:
    """The container's RPW_* settings as the equivalent serve flags (RPW_MAX_VICTIMS=3 ->
    --max-victims 3); the downward-API ones are the launcher's to give."""
    flags: list[str] = []
    for variable in container["env"]:
        if "value" in variable:
            name = variable["name"].removeprefix("RPW_").lower().replace("_", "-")
            flags += [f"--{name}", variable["value"]]
    return flags


def server_flags(container: dict[str, Any]) -> list[str]:
    """The container's server options that are not the launcher's to give (paths, ports):
    ``--workers 2`` as the chart passes it."""
    args = container["args"]
    at = args.index("--workers")
    return args[at : at + 2]


def helm_objects(cluster: Cluster, manifest: str) -> list[str]:
    """``kind/namespace/name`` of every object of a release manifest that still exists."""
    present = []
    for obj in (d for d in yaml.safe_load_all(manifest) if d):
        kind, meta = obj["kind"], obj["metadata"]
        group_version = obj["apiVersion"]
        prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        plural = kind.lower() + ("es" if kind.endswith("s") else "s")
        plural = plural.removesuffix("ys") + "ies" if plural.endswith("ys") else plural
        namespace = f"/namespaces/{meta['namespace']}" if "namespace" in meta else ""
        if get(cluster, f"{prefix}{namespace}/{plural}/{meta['name']}") is not None:
            present.append(f"{kind}/{meta.get('namespace', '')}/{meta['name']}")
    return present


def test_install_walkthrough_upgrade_and_uninstall(
    cluster: Cluster,
    helm: Helm,
    release_namespace: str,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    wait_until: Waiter,
    tmp_path: Path,
) -> None:
    values = {
        "image.localBuild": True,
        "certificates.mode": "self-signed",
        "certificates.ipAddresses": ["127.0.0.1"],
        "mutating.enabled": True,
        # Only the walkthrough's namespace: other tests' resizes never reach this release.
        "webhook.namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    }

    # -- install --------------------------------------------------------------------------
    helm("install", RELEASE, str(CHART), *set_args(values))
    status = json.loads(helm("status", RELEASE, "-o", "json").stdout)
    assert "deployed" == status["info"]["status"]
    assert "resize-preemption-webhook" in status["info"]["notes"]
    manifest = helm("get", "manifest", RELEASE).stdout
    kinds = sorted(o.split("/")[0] for o in helm_objects(cluster, manifest))
    assert [
        "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
        "Deployment", "MutatingWebhookConfiguration", "PodDisruptionBudget", "Role", "Role",
        "RoleBinding", "Secret", "Service", "ServiceAccount",
        # lending's and the Leases'
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    ] == kinds  # fmt: skip
    config = get(cluster, f"{VALIDATING}/{FULLNAME}")
    assert config is not None
    secret = get(cluster, f"/api/v1/namespaces/{release_namespace}/secrets/{FULLNAME}-tls")
    assert secret is not None
    ca_bundle = secret["data"]["ca.crt"]
    assert ca_bundle == config["webhooks"][0]["clientConfig"]["caBundle"]

    # -- the walkthrough, with the webhook as the chart runs it --------------------------
    container = container_of(deployment(cluster, release_namespace))
    assert ["python", "-m", "webhook"] == container["command"]
    assert CONTAINER_ARGS == container["args"]
    cert_dir = tmp_path / "tls"
    cert_dir.mkdir()
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (cert_dir / key).write_bytes(base64.b64decode(secret["data"][key]))
    port, metrics_port = free_port(), free_port()
    # As the chart's ServiceAccount, with the chart's RBAC and under its policies.
    account = account_kubeconfig(cluster, release_namespace, FULLNAME, cert_dir)
    process = launch(
        account,
        cert_dir,
        tmp_path / "webhook.log",
        port=port,
        metrics_port=metrics_port,
        ca_pem=(cert_dir / "ca.crt").read_bytes(),
        # What the downward API gives the pod: its namespace and its name.
        namespace=release_namespace,
        # The chart's server options as it passes them (two worker processes).
        extra_args=[
            *setting_flags(container),
            *server_flags(container),
            "--identity",
            f"{FULLNAME}-0",
        ],
    )
    service_config = config["webhooks"][0]["clientConfig"]
    by_url = {"url": f"https://127.0.0.1:{port}/validate-resize", "caBundle": ca_bundle}
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig", "value": by_url}]
    try:
        cluster.client.request(
            "PATCH", f"{VALIDATING}/{FULLNAME}", body=patch,
            content_type="application/json-patch+json",
        )  # fmt: skip
        time.sleep(1.0)  # kube-apiserver's webhook informer picks up the change
        walkthrough(kubectl, priority_classes)
        result = resize(kubectl, "high-priority-pod", "6")
        expect_preempted_and_actuated(cluster, namespace, result, wait_until, cpu="6")
    finally:
        process.stop()
        back = [{"op": "replace", "path": "/webhooks/0/clientConfig", "value": service_config}]
        cluster.client.request(
            "PATCH", f"{VALIDATING}/{FULLNAME}", body=back,
            content_type="application/json-patch+json",
        )  # fmt: skip
    log = (tmp_path / "webhook.log").read_text()
    assert '"verdict":"preempt"' in log

    # -- upgrade: a changed value reaches the Deployment, the certificates stay ----------
    helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values",
        *set_args({"settings.mode": "warn", "settings.maxVictims": 3}),
    )  # fmt: skip
    env = {
        e["name"]: e.get("value")
        for e in container_of(deployment(cluster, release_namespace))["env"]
    }
    assert ("warn", "3", "evict") == (
        env["RPW_MODE"],
        env["RPW_MAX_VICTIMS"],
        env["RPW_EVICTION_METHOD"],
    )
    assert 2 == json.loads(helm("status", RELEASE, "-o", "json").stdout)["version"]
    upgraded = get(cluster, f"{VALIDATING}/{FULLNAME}")
    assert upgraded is not None
    assert ca_bundle == upgraded["webhooks"][0]["clientConfig"]["caBundle"]
    assert {"service": service_config["service"], "caBundle": ca_bundle} == (
        upgraded["webhooks"][0]["clientConfig"]
    )

    # -- uninstall: webhook configurations first, then nothing of the release is left ----
    removed = helm("uninstall", RELEASE, "--debug")
    order = re.findall(r'msg="starting delete resource" .* kind=(\w+)$', removed.stderr, re.M)
    assert sorted(order) == kinds, removed.stderr
    assert ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] == order[:2]
    assert [] == helm_objects(cluster, manifest)
    for path in (VALIDATING, MUTATING):
        assert get(cluster, f"{path}/{FULLNAME}") is None
    assert [] == json.loads(helm("list", "-o", "json").stdout)
    gone = helm("status", RELEASE, check=False)
    assert (1, "Error: release: not found") == (gone.returncode, gone.stderr.strip())
    leftover = cluster.client.get(
        f"/api/v1/namespaces/{release_namespace}/secrets",
    )["items"]
    assert [] == [
        s["metadata"]["name"] for s in leftover if s["metadata"]["name"].startswith("sh.helm")
    ]


# --- the move from a chart that made its own namespace ---------------------------------

#: The last commit whose chart made the Namespace resize-preemption-system itself, its
#: release installed into default: the layout docs/deploy.md's block moves from.
OLD_LAYOUT = "904e723e38d3c0c7808f937e6ab358ebbefa2731"
OLD_RELEASE = "resize-preemption-webhook"
DOCUMENTED_NAMESPACE = "resize-preemption-system"
DEPLOY_MD = REPO_ROOT / "docs" / "deploy.md"


def old_chart(target: Path) -> Path:
    """The chart as it was at OLD_LAYOUT, from the repository's history."""
    target.mkdir()
    chart = "deploy/helm/resize-preemption-webhook"
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", OLD_LAYOUT, chart],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if archive.returncode != 0:
        pytest.skip(f"the chart of {OLD_LAYOUT[:7]} is not in this clone's history")
    (target / "old.tar").write_bytes(archive.stdout)
    with tarfile.open(target / "old.tar") as tar:
        tar.extractall(target, filter="data")
    return target / chart


def upgrade_block() -> list[str]:
    """The commands of docs/deploy.md's "Upgrading from a chart that made its own
    namespace", one per element (continued lines joined)."""
    section = DEPLOY_MD.read_text().split("\n### Upgrading from a chart that made its own", 1)[1]
    (block,) = re.findall(r"```sh\n(.*?)```", section.split("\n#", 1)[0], re.S)
    return [c for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def finish_namespace(cluster: Cluster, name: str) -> None:
    """What the namespace controller (not run here) does once a namespace is deleted and
    empty: drop its finalizers so it goes."""
    try:
        found = cluster.client.get(f"/api/v1/namespaces/{name}")
        found["spec"]["finalizers"] = []
        cluster.client.replace(f"/api/v1/namespaces/{name}/finalize", found)
    except ApiError as e:
        if e.status != 404:
            raise


@pytest.fixture
def old_layout(cluster: Cluster) -> Iterator[Helm]:
    """The old layout's release, and nothing of either release or the namespace after."""
    yield Helm(cluster, "default")
    for release, where in ((OLD_RELEASE, "default"), (RELEASE, DOCUMENTED_NAMESPACE)):
        Helm(cluster, where)("uninstall", release, "--ignore-not-found", check=False)
    _remove_namespace(cluster, DOCUMENTED_NAMESPACE)


def test_the_documented_move_from_the_old_layout_runs_as_written(
    cluster: Cluster, old_layout: Helm, tmp_path: Path
) -> None:
    old = old_chart(tmp_path / "old")
    # What an operator of the old layout gave: their image, and (here) no namespace of
    # other tests' resizes.
    given = {
        "image.repository": "registry.example/you/resize-preemption-webhook",
        "webhook.namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "none"}},
    }
    old_layout("install", OLD_RELEASE, str(old), *set_args(given))
    namespace = get(cluster, f"/api/v1/namespaces/{DOCUMENTED_NAMESPACE}")
    assert namespace is not None
    assert "default" == namespace["metadata"]["annotations"]["meta.helm.sh/release-namespace"]

    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        # kubectl, helm and the kubectl plugin (the console script next to this Python).
        "PATH": os.pathsep.join([str(Path(cluster.binaries.kubectl).parent),
                                 str(helm_binary().parent), str(Path(sys.executable).parent),
                                 os.environ["PATH"]]),
    }  # fmt: skip
    # The block's relative paths are the repository's; the files it writes stay here.
    work = tmp_path / "work"
    work.mkdir()
    (work / "deploy").symlink_to(REPO_ROOT / "deploy")
    for command in upgrade_block():
        if command.startswith("OLD="):
            env["OLD"] = command.split("=", 1)[1].split()[0]
            continue
        if command.startswith("kubectl wait --for=delete namespace/"):
            finish_namespace(cluster, DOCUMENTED_NAMESPACE)
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert 0 == run.returncode, f"{command}\n{run.stdout}\n{run.stderr}"

    moved = Helm(cluster, DOCUMENTED_NAMESPACE)
    assert [RELEASE] == [r["name"] for r in json.loads(moved("list", "-o", "json").stdout)]
    assert [] == json.loads(old_layout("list", "-o", "json").stdout)
    found = get(cluster, f"/apis/apps/v1/namespaces/{DOCUMENTED_NAMESPACE}/deployments/{FULLNAME}")
    assert found is not None
    assert "registry.example/you/resize-preemption-webhook:0.1.0" == (container_of(found)["image"])
    assert get(cluster, f"{VALIDATING}/{OLD_RELEASE}") is None
    config = get(cluster, f"{VALIDATING}/{FULLNAME}")
    assert config is not None
    assert {"kubernetes.io/metadata.name": "none"} == config["webhooks"][0]["namespaceSelector"][
        "matchLabels"
    ]
    assert DOCUMENTED_NAMESPACE == config["webhooks"][0]["clientConfig"]["service"]["namespace"]
    namespace = get(cluster, f"/api/v1/namespaces/{DOCUMENTED_NAMESPACE}")
    assert namespace is not None
    assert "meta.helm.sh/release-name" not in (namespace["metadata"].get("annotations") or {})
