"""kube-apiserver's client certificate made and renewed by the service (certificates mode
``service`` with ``clientAuth``), against the real kube-apiserver.

This module's control plane gives kube-apiserver an AdmissionConfiguration whose
kubeconfig names a client certificate and key *by file*, as docs/deploy.md tells an
operator to (kubeadm, kind); they start as a certificate of a CA the service never
trusts. The service, started as the chart starts it (``serve --tls-secret ...
--tls-client-secret ... --client-ca FILE``):

* writes its client Secret: a CA, and a clientAuth certificate for
  ``kube-apiserver`` (its default ``client-cn``) it signed; the ``client-ca`` file holds that CA;
* completes a handshake only with a caller presenting that certificate: one presenting
  none is refused at the handshake;
* is reached by kube-apiserver once the Secret's ``tls.crt`` and ``tls.key`` are copied
  over the files its kubeconfig names, without restarting it (client-go rereads
  certificate files named in a kubeconfig);
* renews the certificate with the same CA: the copy kube-apiserver still holds keeps
  being accepted, and the renewed one once copied.

kube-apiserver builds a webhook's client once per version of its configuration: when the
files were missing then, it fails to call the webhook until the configuration changes,
even after they appear; the annotation docs/deploy.md gives after the first copy lets it
in.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness import pki as harness_pki
from harness.binaries import REPO_ROOT, ensure_binaries
from harness.kubectl import Kubectl
from harness.launcher import ControlPlane, ControlPlaneConfig, free_port
from harness.nodes import HollowNodes, NodeOptions, default_nodes
from harness.processes import ManagedProcess, install_signal_handlers, spawn
from harness.webhook_process import (
    CONFIGURATION_NAME,
    ensure_namespace,
    register,
    unregister,
    webhook_configuration,
)
from tests.e2e.conftest import GRACE_CAP, NODE, Cluster, Waiter
from tests.e2e.service_support import (
    forged_review,
    kubectl_warnings,
    pod_manifest,
    post_review,
    read_pod,
    resize,
    run_pods,
)
from webhook.base.settings import DEFAULT_CLIENT_CN
from webhook.cli import _managed_tls, build_parser
from webhook.kube.certs import ensure_client
from webhook.kube.client import make_api_client
from webhook.tls import pki

pytestmark = pytest.mark.e2e

SERVICE_NAMESPACE = "rpw-client-cert"
TLS_SECRET = "rpw-tls"
CLIENT_SECRET = "rpw-apiserver-client"
#: The annotation docs/deploy.md has the operator set after the first copy.
TOUCHED = "resize-preemption.io/client-certificate-copied"


def _present_a_strangers_certificate(cert: Path, key: Path) -> None:
    """The files kube-apiserver presents: a certificate of a CA nobody trusts."""
    stranger = harness_pki.make_client_cert(pki.make_ca("stranger"), "kube-apiserver")
    cert.write_bytes(stranger.cert_pem)
    key.write_bytes(stranger.key_pem)


def _write_admission_config(directory: Path) -> tuple[Path, Path, Path]:
    """kube-apiserver's AdmissionConfiguration naming a kubeconfig whose one user (``*``,
    every webhook) presents the client certificate and key files. Returns (admission
    config, cert file, key file)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "webhook-client.crt", directory / "webhook-client.key"
    kubeconfig = directory / "webhook-client.kubeconfig"
    user = {"client-certificate": str(cert), "client-key": str(key)}
    kubeconfig.write_text(
        yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]}
        )
    )
    plugin = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    admission = directory / "admission-config.yaml"
    admission.write_text(
        yaml.safe_dump({
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [{"name": n, "configuration": plugin}
                        for n in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")],
        })
    )  # fmt: skip
    return admission, cert, key


@pytest.fixture(scope="module")
def apiserver_client_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return _write_admission_config(tmp_path_factory.mktemp("apiserver-client"))


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, apiserver_client_files: tuple[Path, Path, Path]
) -> Iterator[Cluster]:
    """The session's cluster, kube-apiserver given the AdmissionConfiguration above (the
    flag given last wins over the harness's own)."""
    install_signal_handlers()
    binaries = ensure_binaries()
    admission = apiserver_client_files[0]
    config = ControlPlaneConfig(
        state_dir=tmp_path_factory.mktemp("cluster"),
        apiserver_args=[f"--admission-control-config-file={admission}"],
    )
    with ControlPlane(binaries, config) as control_plane:
        nodes = HollowNodes(control_plane, default_nodes(1), NodeOptions(stop_grace_cap=GRACE_CAP))
        with nodes:
            yield Cluster(control_plane, nodes, binaries)
            assert not nodes.errors, f"a node failed: {nodes.errors!r}"


def _serve_args(port: int, metrics_port: int, probe_port: int, files: Path) -> list[str]:
    """``serve`` as the chart's Deployment runs it in mode service with clientAuth, the
    Service's name being ``localhost`` (kube-apiserver calls the webhook there)."""
    return [
        "serve",
        *("--tls-cert", str(files / "tls" / "tls.crt")),
        *("--tls-key", str(files / "tls" / "tls.key")),
        *("--port", str(port), "--metrics-port", str(metrics_port)),
        *("--probe-port", str(probe_port), "--service-namespace", SERVICE_NAMESPACE),
        *("--tls-secret", TLS_SECRET, "--tls-webhook-config", CONFIGURATION_NAME),
        *("--tls-dns", "localhost", "--tls-client-secret", CLIENT_SECRET),
        *("--client-ca", str(files / "client-ca" / "ca.crt")),
        *("--mode", "warn"),
    ]  # fmt: skip


class Service:
    """The service process, its ports and files."""

    def __init__(self, cluster: Cluster, files: Path, extra: Sequence[str] = ()) -> None:
        self.cluster = cluster
        self.files = files
        self.port, self.metrics_port, self.probe_port = free_port(), free_port(), free_port()
        self.args = [*_serve_args(self.port, self.metrics_port, self.probe_port, files), *extra]
        argv = [sys.executable, "-m", "webhook", *self.args]
        argv += ["--kubeconfig", str(cluster.kubeconfig)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process: ManagedProcess = spawn(
            "webhook", argv, files / "webhook.log", env=env, cwd=REPO_ROOT
        )

    def secret(self, name: str) -> dict[str, bytes]:
        found = self.cluster.client.get(f"/api/v1/namespaces/{SERVICE_NAMESPACE}/secrets/{name}")
        return {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}

    def ready(self) -> bool:
        """Whether the probe port answers /readyz 200 (no client certificate)."""
        ca = self.secret(TLS_SECRET).get("ca.crt")
        if ca is None:
            return False
        context = ssl.create_default_context(cadata=ca.decode())
        context.check_hostname = False
        try:
            url = f"https://127.0.0.1:{self.probe_port}/readyz"
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False


@pytest.fixture
def service(
    cluster: Cluster,
    tmp_path: Path,
    wait_until: Waiter,
    apiserver_client_files: tuple[Path, Path, Path],
    request: pytest.FixtureRequest,
) -> Iterator[Service]:
    """kube-apiserver presenting a stranger's certificate; the chart's empty Secrets and
    webhook configuration (no caBundle), then the service (given the flags of an indirect
    parameter, if any). Its Secrets and configuration go when the test ends."""
    _present_a_strangers_certificate(*apiserver_client_files[1:])
    client = cluster.client
    ensure_namespace(client, SERVICE_NAMESPACE)
    for name in (TLS_SECRET, CLIENT_SECRET):
        client.create(
            f"/api/v1/namespaces/{SERVICE_NAMESPACE}/secrets",
            {"metadata": {"name": name}, "type": "Opaque"},
        )
    configuration = webhook_configuration(0, b"", SERVICE_NAMESPACE)
    hook = configuration["webhooks"][0]
    started = Service(cluster, tmp_path, getattr(request, "param", ()))
    hook["clientConfig"] = {"url": f"https://localhost:{started.port}/validate-resize"}
    register(client, configuration)
    try:
        wait_until(
            lambda: started.ready() or not started.process.running(),
            timeout=90,
            what="the service ready on its probe port",
        )
        assert started.process.running(), started.process.log_tail(20)
        yield started
    finally:
        unregister(client)
        started.process.stop()
        for name in (TLS_SECRET, CLIENT_SECRET):
            client.delete(f"/api/v1/namespaces/{SERVICE_NAMESPACE}/secrets/{name}")


def _copy_to_the_control_plane(data: dict[str, bytes], cert: Path, key: Path) -> None:
    """What the operator does on each control-plane node: the Secret's pair over the files
    kube-apiserver's kubeconfig names, each renamed into place (key first)."""
    for target, content in ((key, data["tls.key"]), (cert, data["tls.crt"])):
        fd, partial = tempfile.mkstemp(dir=target.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.replace(partial, target)


def _scene(kubectl: Kubectl, priority_classes: dict[str, str]) -> None:
    """node-1 (8 CPU): low-priority-pod 3 CPU, high-priority-pod 4 CPU."""
    low = pod_manifest("low-priority-pod", "3", priority_classes["low"])
    run_pods(kubectl, [low, pod_manifest("high-priority-pod", "4", priority_classes["high"])])


def _warned(kubectl: Kubectl, namespace: str) -> bool:
    """Whether a dry-run resize needing preemption got the webhook's warning, i.e.
    kube-apiserver's call got past the handshake."""
    result = resize(kubectl, "high-priority-pod", "6", "--dry-run=server")
    assert 0 == result.returncode, result.stderr
    wanted = f"would preempt 1 lower-priority pod on {NODE} for cpu 6: {namespace}/low-priority-pod"
    return any(wanted in w for w in kubectl_warnings(result))


def _refused_without_a_certificate(service: Service) -> None:
    context = ssl.create_default_context(cadata=service.secret(TLS_SECRET)["ca.crt"].decode())
    context.maximum_version = ssl.TLSVersion.TLSv1_2  # the verdict ends the handshake
    with (
        pytest.raises(ssl.SSLError, match=r"(?i)handshake failure|certificate"),
        socket.create_connection(("127.0.0.1", service.port), timeout=5) as raw,
    ):
        context.wrap_socket(raw, server_hostname="localhost")


def _answered_with(service: Service, client: dict[str, bytes], pod: dict[str, Any]) -> bool:
    context = ssl.create_default_context(cadata=service.secret(TLS_SECRET)["ca.crt"].decode())
    cert, key = service.files / "presented.crt", service.files / "presented.key"
    cert.write_bytes(client["tls.crt"])
    key.write_bytes(client["tls.key"])
    context.load_cert_chain(str(cert), str(key))
    review = forged_review(pod, pod)
    url = f"https://localhost:{service.port}"
    return bool(review["request"]["uid"] == post_review(url, context, review)["response"]["uid"])


def _refused_with_another_name(
    service: Service, client: dict[str, bytes], pod: dict[str, Any]
) -> None:
    """A certificate the service's client CA signed for another Common Name than
    ``client-cn`` (a kubelet's name): its handshake completes, the connection closes
    unanswered."""
    authority = pki.CertificateAuthority(cert_pem=client["ca.crt"], key_pem=client["ca.key"])
    other = harness_pki.make_client_cert(authority, "system:node:node-1", groups=["system:nodes"])
    with pytest.raises(OSError):  # urllib's URLError and the connection's end alike
        _answered_with(service, {"tls.crt": other.cert_pem, "tls.key": other.key_pem}, pod)


def test_the_service_issues_kube_apiservers_client_certificate_and_trusts_only_it(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    apiserver_client_files: tuple[Path, Path, Path],
    wait_until: Waiter,
) -> None:
    client = service.secret(CLIENT_SECRET)
    assert ["ca.crt", "ca.key", "tls.crt", "tls.key"] == sorted(client)
    certificate = x509.load_pem_x509_certificate(client["tls.crt"])
    (ca,) = x509.load_pem_x509_certificates(client["ca.crt"])
    certificate.verify_directly_issued_by(ca)
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ([ExtendedKeyUsageOID.CLIENT_AUTH], DEFAULT_CLIENT_CN) == (
        list(usages),
        certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
    )
    assert client["ca.crt"] == (service.files / "client-ca" / "ca.crt").read_bytes()

    _scene(kubectl, priority_classes)
    pod = read_pod(cluster, namespace, "high-priority-pod")
    assert pod is not None
    _refused_without_a_certificate(service)
    _refused_with_another_name(service, client, pod)
    assert _answered_with(service, client, pod)

    # kube-apiserver presents a certificate of another CA: refused, the resize unchecked.
    _, cert_file, key_file = apiserver_client_files
    assert not _warned(kubectl, namespace)
    _copy_to_the_control_plane(client, cert_file, key_file)
    wait_until(lambda: _warned(kubectl, namespace), timeout=30, what="kube-apiserver let in")


def test_a_renewed_client_certificate_keeps_the_ca_and_the_copy_in_use_working(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    apiserver_client_files: tuple[Path, Path, Path],
    wait_until: Waiter,
) -> None:
    _scene(kubectl, priority_classes)
    _, cert_file, key_file = apiserver_client_files
    first = service.secret(CLIENT_SECRET)
    _copy_to_the_control_plane(first, cert_file, key_file)
    wait_until(lambda: _warned(kubectl, namespace), timeout=30, what="kube-apiserver let in")

    # The leader's next look, inside the renewal margin (a year, renewed 30 days early).
    parsed = build_parser().parse_args([*service.args, "--kubeconfig", str(cluster.kubeconfig)])
    tls = _managed_tls(parsed, SERVICE_NAMESPACE, str(service.files / "client-ca" / "ca.crt"))
    api = make_api_client(str(cluster.kubeconfig))
    try:
        later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
        written, renewed = ensure_client(api, tls, now=lambda: later)
    finally:
        api.close()
    assert (True, first["ca.crt"], first["ca.key"]) == (
        written,
        renewed["ca.crt"],
        renewed["ca.key"],
    )
    assert first["tls.crt"] != renewed["tls.crt"]
    assert renewed == service.secret(CLIENT_SECRET)
    # The copy on the control plane is the old one: still accepted until it expires;
    # the renewed one is accepted as well.
    assert _warned(kubectl, namespace)
    pod = read_pod(cluster, namespace, "high-priority-pod")
    assert pod is not None
    assert [True, True] == [_answered_with(service, c, pod) for c in (first, renewed)]


def test_files_missing_at_kube_apiservers_first_call_need_the_configuration_touched(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    apiserver_client_files: tuple[Path, Path, Path],
    wait_until: Waiter,
) -> None:
    _scene(kubectl, priority_classes)
    _, cert_file, key_file = apiserver_client_files
    cert_file.unlink()
    key_file.unlink()
    assert not _warned(kubectl, namespace)  # the first call: no files, no client
    _copy_to_the_control_plane(service.secret(CLIENT_SECRET), cert_file, key_file)
    time.sleep(3)  # client-go rereads files once a second; this is not that
    assert not _warned(kubectl, namespace)

    # docs/deploy.md: annotate the configuration after the first copy.
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kubectl("annotate", "validatingwebhookconfiguration", CONFIGURATION_NAME,
            f"{TOUCHED}={now}", "--overwrite")  # fmt: skip
    wait_until(lambda: _warned(kubectl, namespace), timeout=30, what="kube-apiserver let in")


#: Lifetimes short enough that every replica looks at the Secrets every 10 s.
QUICK = ["--tls-client-validity", "1h", "--tls-client-renew-before", "60s"]


@pytest.mark.parametrize("service", [QUICK], indirect=True, ids=["quick"])
def test_a_renewed_ca_is_trusted_by_the_running_service_with_the_old_one(
    cluster: Cluster,
    namespace: str,
    priority_classes: dict[str, str],
    kubectl: Kubectl,
    service: Service,
    wait_until: Waiter,
) -> None:
    """The CA renewed by the leader (here: its look at a time the CA would not outlive a
    new certificate): every replica trusts the new CA within a period, the old one
    still, so the copy kube-apiserver holds and the renewed certificate both get in."""
    _scene(kubectl, priority_classes)
    pod = read_pod(cluster, namespace, "high-priority-pod")
    assert pod is not None
    first = service.secret(CLIENT_SECRET)
    ca_file = service.files / "client-ca" / "ca.crt"
    parsed = build_parser().parse_args([*service.args, "--kubeconfig", str(cluster.kubeconfig)])
    tls = _managed_tls(parsed, SERVICE_NAMESPACE, str(ca_file))
    assert tls.client is not None and 10.0 == tls.client.policy.period
    (old_ca,) = x509.load_pem_x509_certificates(first["ca.crt"])
    late = old_ca.not_valid_after_utc - dt.timedelta(minutes=30)
    api = make_api_client(str(cluster.kubeconfig))
    try:
        written, renewed = ensure_client(api, tls, now=lambda: late)
    finally:
        api.close()
    bundle = x509.load_pem_x509_certificates(renewed["ca.crt"])
    assert (True, 2, old_ca) == (written, len(bundle), bundle[1])
    assert first["ca.key"] != renewed["ca.key"]
    wait_until(lambda: ca_file.read_bytes() == renewed["ca.crt"], timeout=30,
               what="the replica following the client Secret")  # fmt: skip
    assert [True, True] == [_answered_with(service, c, pod) for c in (first, renewed)]


def test_a_client_secret_the_chart_did_not_make_stops_the_start_named(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``create`` cannot be limited to a name, so the service only fills Secrets that
    exist: without the client Secret the start-up run fails, naming it."""
    client = cluster.client
    ensure_namespace(client, SERVICE_NAMESPACE)
    client.create(
        f"/api/v1/namespaces/{SERVICE_NAMESPACE}/secrets",
        {"metadata": {"name": TLS_SECRET}, "type": "Opaque"},
    )
    try:
        args = [*_serve_args(1, 2, 3, tmp_path), "--kubeconfig", str(cluster.kubeconfig)]
        parsed = build_parser().parse_args(args)
        tls = _managed_tls(parsed, SERVICE_NAMESPACE, str(tmp_path / "client-ca" / "ca.crt"))
        payload = {"tls": tls.to_json(), "kubeconfig": str(cluster.kubeconfig), "timeout": 0}
        done = subprocess.run(
            [sys.executable, "-m", "webhook.kube.certs"],
            input=json.dumps(payload), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        client.delete(f"/api/v1/namespaces/{SERVICE_NAMESPACE}/secrets/{TLS_SECRET}")
    assert (1, [
        f"error: the certificates in Secret {SERVICE_NAMESPACE}/{TLS_SECRET}, "
        f"{SERVICE_NAMESPACE}/{CLIENT_SECRET}: HTTP 404: secrets \"{CLIENT_SECRET}\" not found"
    ]) == (done.returncode, done.stderr.strip().splitlines()[-1:])  # fmt: skip
