"""`helm install` on the real node with nothing else: the README's "Install on your cluster"
block run as written, then an upgrade and a certificate that nears its expiry.

* the README block, taken from README.md on every run (the README cannot drift from what
  works): the chart with only the image values set, in its default certificates mode
  (``service``, no cert-manager), gives two replicas Running and Ready from the image,
  `kubectl resize-preemption status` names a leader, and kube-apiserver reaches them
  through the Service with the caBundle the service set itself: a resize that needs room
  gets the webhook's warning and its victim is preempted;
* `helm upgrade` (a changed value, so the pods roll) keeps the Secret's CA, key and
  certificate and the caBundle: the new replicas serve the same certificate and reviews
  keep arriving;
* a short validity set through the chart's values: the certificate is renewed when it
  nears its expiry, before it expires, by the same CA (the caBundle never changes), both
  replicas serve the new one without a restart, and reviews keep arriving after the old
  one expired.

The block's only substitutions: ``IMAGE=`` names the local build, and its build and push
lines are not run - the ``real_cluster`` fixture built the image with the same script
(``scripts/build-image.sh``, what ``make image`` runs) and imported it into node-1's
containerd, which is what ``kind load`` does. The session's own release (harness.chart)
has the same cluster-wide names, so it is uninstalled first and installed again after.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from harness.binaries import REPO_ROOT
from harness.chart import CHART, NAME, helm_binary, run_helm
from harness.realcluster import RealCluster
from harness.realnode import NODE_NAME
from harness.walkthrough import resize_patch, scaled_walkthrough
from tests.e2e.conftest import Waiter, _remove_namespace
from tests.e2e.test_realnode import (
    classes,  # noqa: F401 - a fixture
    guaranteed,
    read,
    restarts,
    start,
    warnings,
    workload,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

README = REPO_ROOT / "README.md"
#: What the README installs: the release rpw in resize-preemption-system.
RELEASE = "rpw"
NAMESPACE = "resize-preemption-system"
FULLNAME = f"{RELEASE}-{NAME}"
SECRET = f"/api/v1/namespaces/{NAMESPACE}/secrets/{FULLNAME}-tls"
VALIDATING = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{FULLNAME}"
WEBHOOK_PORT = 8443


def readme_block() -> str:
    """The one ``sh`` block of the README's "Install on your cluster" section."""
    section = README.read_text().split("\n## Install on your cluster\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert 1 == len(blocks), "the install section has one sh block"
    return str(blocks[0])


def run_here(block: str, repository: str) -> str:
    """The block with ``IMAGE=`` the local build's repository, its build and push lines
    left out (the fixture built and imported the image); each replaced line must exist."""
    lines, replaced = [], []
    for line in block.splitlines():
        if line.startswith("IMAGE="):
            lines.append(f"IMAGE={repository}")
            replaced.append("IMAGE")
        elif line.startswith(("make image ", "docker push ")):
            lines.append(f": built and imported by the fixture: {line.split('#')[0]}")
            replaced.append(line.split()[0])
        else:
            lines.append(line)
    assert ["IMAGE", "make", "docker"] == replaced, block
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def readme_release(real_cluster: RealCluster) -> Iterator[None]:
    """No release installed at the start, and the session's release back at the end."""
    real_cluster.uninstall_chart()
    yield
    run_helm(
        real_cluster.kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE,
        "--ignore-not-found",
    )  # fmt: skip
    # No namespace controller here: the namespace helm made is finished by hand.
    _remove_namespace(real_cluster, NAMESPACE)
    real_cluster.install_chart()


def secret_data(cluster: RealCluster) -> dict[str, bytes]:
    data = cluster.client.get(SECRET).get("data") or {}
    return {k: base64.b64decode(v) for k, v in data.items()}


def ca_bundles(cluster: RealCluster) -> list[bytes]:
    config = cluster.client.get(VALIDATING)
    return [base64.b64decode(w["clientConfig"]["caBundle"]) for w in config["webhooks"]]


def release_pods(cluster: RealCluster, *, stopping: bool = False) -> list[dict[str, Any]]:
    """The release's pods; ``stopping``: those being deleted too."""
    pods = cluster.client.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        labelSelector=f"app.kubernetes.io/name={NAME}",
    )["items"]
    return [p for p in pods if stopping or not p["metadata"].get("deletionTimestamp")]


def served(address: str, ca_pem: bytes) -> x509.Certificate:
    """The certificate a replica serves, verified against ``ca_pem`` for the Service's
    name as kube-apiserver verifies it (an expired one fails the handshake)."""
    import socket
    import ssl

    context = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection((address, WEBHOOK_PORT), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=f"{FULLNAME}.{NAMESPACE}.svc") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def certificate(data: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data["tls.crt"])


def rollout(cluster: RealCluster, wait_until: Waiter) -> None:
    """The upgrade rolled out, and no pod of the old revision runs any more (a stopping
    leader could still act with the old values)."""
    cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", f"deployment/{FULLNAME}", "--timeout=300s",
        timeout=320,
    )  # fmt: skip
    wait_until(
        lambda: len(release_pods(cluster, stopping=True)) == 2,
        timeout=90, interval=1, what="the old pods gone",
    )  # fmt: skip


def ready_replicas(cluster: RealCluster) -> list[tuple[str, str, bool]]:
    return sorted(
        (
            p["spec"].get("nodeName", ""),
            p["status"].get("phase", ""),
            bool((p["status"].get("containerStatuses") or [{}])[0].get("ready")),
        )
        for p in release_pods(cluster)
    )


def preempting_resize(
    cluster: RealCluster, namespace: str, priority: dict[str, str], wait_until: Waiter
) -> None:
    """A resize that needs a lower-priority pod's room: the webhook's warning, the victim
    preempted - kube-apiserver called the webhook through its Service."""
    # Pods an earlier test left on their way out would still count on the node, and the
    # resize would fit once they are gone instead of preempting: wait them out first.
    wait_until(lambda: not cluster.leaving(), timeout=120, what="node-1 settled")
    walk = scaled_walkthrough(cluster.allocatable_millicores(), cluster.requested_millicores())
    image = cluster.image("workload")
    start(cluster, namespace, [
        workload("low", image, priority["low"], guaranteed(f"{walk.low}m", "32Mi")),
        workload("high", image, priority["high"], guaranteed(f"{walk.high}m", "32Mi")),
    ])  # fmt: skip
    result = cluster.kubectl(
        "patch", "-n", namespace, "pod", "high", "--subresource", "resize",
        "--patch", resize_patch(walk.target),
    )  # fmt: skip
    assert [f"Warning: preempting 1 lower-priority pod on {NODE_NAME}"] == [
        w.split(" for ")[0] for w in warnings(result)
    ], result.stderr
    wait_until(lambda: read(cluster, namespace, "low") is None, timeout=60, what="the victim gone")
    cluster.kubectl("delete", "-n", namespace, "pod", "high", "--wait=true", "--grace-period=1")


def image_labels(archive: Path) -> dict[str, str]:
    """The labels in the configuration of an OCI archive's one image."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> Any:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return json.load(member)

        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = blob(index["manifests"][0]["digest"])
        labels: dict[str, str] = blob(manifest["config"]["digest"])["config"]["Labels"]
    return labels


def test_the_image_carries_its_oci_labels(real_cluster: RealCluster) -> None:
    """The image the README installs, built by `make image`'s script: version, revision
    and source as the OCI annotations spec names them."""
    archive = next(path for _, path, role in real_cluster.images.entries() if role == "product")
    labels = image_labels(archive)
    version = re.search(r'^version = "(.*)"$', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert version[1] == labels["org.opencontainers.image.version"]
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels["org.opencontainers.image.revision"])
    # The source is the git remote of the checkout that built the image (the cached image
    # may come from another checkout of the same files): never with credentials in it.
    source = labels["org.opencontainers.image.source"]
    assert None is re.search(r"//[^/]*@", source), source


def test_the_readme_install_section_runs_as_written(
    real_cluster: RealCluster,
    readme_release: None,
    real_namespace: str,
    classes: dict[str, str],  # noqa: F811
    wait_until: Waiter,
) -> None:
    repository, _, tag = real_cluster.image("product").rpartition(":")
    block = readme_block()
    assert f"--set image.tag={tag}" in block, "the README installs the tag make image builds"
    tools = [Path(real_cluster.binaries.kubectl).parent, helm_binary().parent]
    env = {
        **os.environ,
        "KUBECONFIG": str(real_cluster.kubeconfig),
        # The kubectl plugin: the console script next to this Python (`pip install .`).
        "PATH": os.pathsep.join([*map(str, tools), str(Path(sys.executable).parent),
                                 os.environ["PATH"]]),
    }  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", run_here(block, repository)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert 0 == done.returncode, f"{done.stdout}\n{done.stderr}"
    took = time.monotonic() - began
    print(f"the README block, helm install to both replicas ready: {took:.1f} s")
    assert "successfully rolled out" in done.stdout, done.stdout
    assert re.search(rf"^leader: {FULLNAME}-\S+ \(renewed", done.stdout, re.M), done.stdout

    assert [(NODE_NAME, "Running", True)] * 2 == ready_replicas(real_cluster)
    image = real_cluster.image("product")
    assert {image} == {
        p["status"]["containerStatuses"][0]["image"] for p in release_pods(real_cluster)
    }
    # The service made its certificates: the Secret it filled, the caBundle it set.
    data = secret_data(real_cluster)
    assert ["ca.crt", "ca.key", "tls.crt", "tls.key"] == sorted(data)
    assert [data["ca.crt"]] == ca_bundles(real_cluster)
    serial = certificate(data).serial_number
    for pod in release_pods(real_cluster):
        assert serial == served(pod["status"]["podIP"], data["ca.crt"]).serial_number
    preempting_resize(real_cluster, real_namespace, classes, wait_until)


def test_helm_upgrade_keeps_the_certificate_and_the_ca_bundle(
    real_cluster: RealCluster,
    readme_release: None,
    real_namespace: str,
    classes: dict[str, str],  # noqa: F811
    wait_until: Waiter,
) -> None:
    before = secret_data(real_cluster)
    assert before, "the README install made the certificate"
    pods_before = {p["metadata"]["name"] for p in release_pods(real_cluster)}
    run_helm(
        real_cluster.kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--reuse-values",
        "--set", "settings.maxVictims=5",
    )  # fmt: skip
    rollout(real_cluster, wait_until)

    pods = release_pods(real_cluster)
    assert set() == pods_before & {p["metadata"]["name"] for p in pods}, "the pods rolled"
    assert before == secret_data(real_cluster)
    assert [before["ca.crt"]] == ca_bundles(real_cluster)
    serial = certificate(before).serial_number
    for pod in pods:
        assert serial == served(pod["status"]["podIP"], before["ca.crt"]).serial_number
    preempting_resize(real_cluster, real_namespace, classes, wait_until)


#: A serving certificate of two minutes renewed 90 s before it expires: 30 s after it is
#: made; the service looks every 15 s (a sixth of the margin).
SHORT = {"certificates.duration": "2m", "certificates.renewBefore": "90s"}


def test_the_certificate_is_renewed_as_it_nears_expiry_and_served_without_a_restart(
    real_cluster: RealCluster,
    readme_release: None,
    real_namespace: str,
    classes: dict[str, str],  # noqa: F811
    wait_until: Waiter,
) -> None:
    long_lived = secret_data(real_cluster)
    run_helm(
        real_cluster.kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--reuse-values",
        *(a for k, v in SHORT.items() for a in ("--set", f"{k}={v}")),
    )  # fmt: skip
    rollout(real_cluster, wait_until)

    # The shorter validity applies at once: a certificate of two minutes (begun five
    # minutes early, for clock skew), the same CA.
    def short() -> dict[str, bytes] | None:
        data = secret_data(real_cluster)
        cert = certificate(data)
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        return data if lifetime == dt.timedelta(minutes=7) else None

    first = wait_until(short, timeout=30, interval=1, what="a certificate of two minutes")
    first_cert = certificate(first)
    assert (long_lived["ca.crt"], long_lived["ca.key"]) == (first["ca.crt"], first["ca.key"])
    restarts_before = {p["metadata"]["name"]: restarts(p) for p in release_pods(real_cluster)}

    def renewed() -> dict[str, bytes] | None:
        data = secret_data(real_cluster)
        return data if certificate(data).serial_number != first_cert.serial_number else None

    second = wait_until(renewed, timeout=120, interval=1, what="the certificate renewed")
    made_at = certificate(second).not_valid_before_utc + dt.timedelta(minutes=5)
    left = first_cert.not_valid_after_utc - made_at
    # Renewed in the margin (90 s before expiry, within a 15 s look), not before, not after.
    assert dt.timedelta(seconds=0) < left <= dt.timedelta(seconds=90), left
    assert (first["ca.crt"], first["ca.key"]) == (second["ca.crt"], second["ca.key"])
    assert [first["ca.crt"]] == ca_bundles(real_cluster)

    # Past the first certificate's expiry every replica serves a valid one (the handshake
    # verifies the dates), a renewed one, and reviews still arrive.
    time.sleep(max(0.0, (first_cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).total_seconds()))
    for pod in release_pods(real_cluster):
        now_served = served(pod["status"]["podIP"], first["ca.crt"])
        assert first_cert.serial_number != now_served.serial_number
        assert now_served.not_valid_after_utc > dt.datetime.now(dt.UTC)
    assert restarts_before == {
        p["metadata"]["name"]: restarts(p) for p in release_pods(real_cluster)
    }
    preempting_resize(real_cluster, real_namespace, classes, wait_until)
    assert [first["ca.crt"]] == ca_bundles(real_cluster)


def lending_uninstall_block() -> list[str]:
    """The command lines of docs/lending.md's uninstall block, as an operator runs them."""
    text = (REPO_ROOT / "docs" / "lending.md").read_text()
    block = re.search(r"uninstall is two steps:\n\n```sh\n(.*?)```", text, re.S)
    assert block is not None, "docs/lending.md has its two-step uninstall block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


#: Kinds the chart makes, by their API path; each listed for the release's label.
RELEASE_KINDS = (
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
    f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets",
    f"/api/v1/namespaces/{NAMESPACE}/services",
    f"/api/v1/namespaces/{NAMESPACE}/secrets",
    f"/api/v1/namespaces/{NAMESPACE}/configmaps",
    f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
    f"/api/v1/namespaces/{NAMESPACE}/pods",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings",
    f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets",
)


def left_of_release(cluster: RealCluster) -> list[str]:
    """Every object the release's label still names, as ``path/name``."""
    selector = f"app.kubernetes.io/instance={RELEASE}"
    return [
        f"{path.rsplit('/', 1)[1]}/{item['metadata']['name']}"
        for path in RELEASE_KINDS
        for item in cluster.client.get(path, labelSelector=selector)["items"]
    ]


def test_the_documented_uninstall_leaves_nothing_of_the_release(
    real_cluster: RealCluster, readme_release: None, wait_until: Waiter
) -> None:
    """docs/lending.md's two steps, as written: `helm uninstall`, then every loan given
    back; nothing the release labels is left (the ledger Leases are the service's, and
    documented as such)."""
    helm, give_back = lending_uninstall_block()
    assert helm == f"helm uninstall {RELEASE} -n {NAMESPACE}", helm
    assert give_back == "kubectl resize-preemption return-loans", give_back
    run_helm(real_cluster.kubeconfig, *helm.split()[1:])
    # The plugin is the console script of the same command.
    returned = subprocess.run(
        [sys.executable, "-m", "webhook", "return-loans", "--kubeconfig",
         str(real_cluster.kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert 0 == returned.returncode, returned.stderr
    # Pods and what they own leave as the garbage collector gets to them.
    wait_until(
        lambda: not left_of_release(real_cluster),
        timeout=120, interval=1, what="nothing of the release left",
    )  # fmt: skip
    assert [] == left_of_release(real_cluster)
