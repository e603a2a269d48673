"""The certs command: CA and serving certificate, files, manifests and exit codes."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import socket
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes.client.exceptions import ApiException

from webhook.cli import main
from webhook.kube import webhookconfig
from webhook.kube.errors import ClusterError, Forbidden
from webhook.tls import certs

SERVICE_NAMES = (
    "resize-preemption-webhook",
    "resize-preemption-webhook.resize-preemption-system",
    "resize-preemption-webhook.resize-preemption-system.svc",
    "resize-preemption-webhook.resize-preemption-system.svc.cluster.local",
)


@pytest.fixture(scope="module")
def made() -> certs.WebhookCerts:
    return certs.make_webhook_certs(dns_names=["Webhook.Example.com"], ip_addresses=["10.0.0.7"])


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ext.get_values_for_type(x509.DNSName), [
        str(a) for a in ext.get_values_for_type(x509.IPAddress)
    ]


# --- the certificates -------------------------------------------------------------------


def test_service_dns_names_cover_every_form_of_the_service_name() -> None:
    assert (
        certs.service_dns_names("resize-preemption-webhook", "resize-preemption-system")
        == SERVICE_NAMES
    )
    assert (
        certs.service_dns_names("svc", "ns", cluster_domain="corp.internal")[-1]
        == "svc.ns.svc.corp.internal"
    )


def test_serving_certificate_has_the_service_names_then_the_extras(
    made: certs.WebhookCerts,
) -> None:
    dns, ips = sans(load(made.cert_pem))

    assert [*SERVICE_NAMES, "webhook.example.com"] == dns
    assert ips == ["10.0.0.7"]
    assert (*SERVICE_NAMES, "webhook.example.com") == made.dns_names
    assert made.ip_addresses == ("10.0.0.7",)


def test_common_name_is_the_name_the_api_server_dials(made: certs.WebhookCerts) -> None:
    subject = load(made.cert_pem).subject.rfc4514_string()
    assert subject == "CN=resize-preemption-webhook.resize-preemption-system.svc"


def test_extras_are_normalised_and_deduplicated() -> None:
    made = certs.make_webhook_certs(
        dns_names=["a.example.com", "A.example.com.", "resize-preemption-webhook", "*.b.example"],
        ip_addresses=["::1", "0:0:0:0:0:0:0:1", "127.0.0.1"],
    )
    dns, ips = sans(load(made.cert_pem))

    assert [*SERVICE_NAMES, "a.example.com", "*.b.example"] == dns
    assert ips == ["::1", "127.0.0.1"]


def test_serving_certificate_is_signed_by_the_ca(made: certs.WebhookCerts) -> None:
    ca, cert = load(made.ca_pem), load(made.cert_pem)

    cert.verify_directly_issued_by(ca)
    assert cert.issuer == ca.subject


def test_ca_key_usages(made: certs.WebhookCerts) -> None:
    ca = load(made.ca_pem)
    basic = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage)

    assert basic.critical and basic.value.ca
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign


def test_serving_key_usages_allow_tls_server_only(made: certs.WebhookCerts) -> None:
    cert = load(made.cert_pem)
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    extended = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value

    assert not basic.ca
    assert usage.digital_signature and not usage.key_cert_sign
    assert list(extended) == [ExtendedKeyUsageOID.SERVER_AUTH]


@pytest.mark.parametrize("days", [1, 30, 365])
def test_validity_is_the_requested_number_of_days(days: int) -> None:
    made = certs.make_webhook_certs(days=days)
    now = dt.datetime.now(dt.UTC)
    for pem in (made.ca_pem, made.cert_pem):
        cert = load(pem)
        assert cert.not_valid_before_utc <= now
        expected = now + dt.timedelta(days=days)
        assert abs((cert.not_valid_after_utc - expected).total_seconds()) < 120


def test_private_key_belongs_to_the_certificate(made: certs.WebhookCerts) -> None:
    key = serialization.load_pem_private_key(made.key_pem, password=None)
    public = load(made.cert_pem).public_key()
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    pem = serialization.Encoding.PEM

    assert public.public_bytes(pem, spki) == key.public_key().public_bytes(pem, spki)


def test_each_run_makes_a_new_ca() -> None:
    assert certs.make_webhook_certs().ca_pem != certs.make_webhook_certs().ca_pem


def test_ca_bundle_is_the_base64_ca_certificate(made: certs.WebhookCerts) -> None:
    assert made.ca_pem == base64.b64decode(made.ca_bundle)


@pytest.fixture
def tls_server(made: certs.WebhookCerts, tmp_path: Path) -> Iterator[int]:
    """A TLS server presenting the serving certificate; yields its port."""
    certs.write_certs(made, tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(5)
    listener.close()


@pytest.mark.parametrize("hostname", [*SERVICE_NAMES, "webhook.example.com", "10.0.0.7"])
def test_a_client_trusting_the_ca_accepts_every_name(
    made: certs.WebhookCerts, tls_server: int, hostname: str
) -> None:
    context = ssl.create_default_context(cadata=made.ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", tls_server), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=hostname) as tls,
    ):
        assert tls.recv(2) == b"ok"


def test_a_client_rejects_a_name_not_in_the_certificate(
    made: certs.WebhookCerts, tls_server: int
) -> None:
    context = ssl.create_default_context(cadata=made.ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", tls_server), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname="other.resize-preemption-system.svc")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ip_addresses": ["10.0.0.300"]}, "--ip '10.0.0.300' is not an IP address"),
        ({"dns_names": ["bad_name.example"]}, "--dns 'bad_name.example' is not a valid DNS"),
        ({"dns_names": ["*"]}, "--dns '*' is not a valid DNS name"),
        ({"dns_names": ["a." * 127 + "com"]}, "is not a valid DNS name"),
        ({"service": "9webhook"}, "service '9webhook' is not an RFC 1035 DNS label"),
        ({"service": "Webhook"}, "service 'Webhook' is not an RFC 1035 DNS label"),
        ({"namespace": "a.b"}, "namespace 'a.b' is not an RFC 1123 DNS label"),
        ({"cluster_domain": "*.local"}, "cluster domain '*.local' is not a valid DNS name"),
        ({"days": 0}, "--days must be between 1 and 3650, not 0"),
        ({"days": 3651}, "--days must be between 1 and 3650"),
    ],
)
def test_bad_arguments_raise_one_clear_input_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(certs.CertsError, match=message.replace("*", r"\*").replace(".", r"\.")):
        certs.make_webhook_certs(**kwargs)


# --- files ------------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_written_with_private_key_0600(made: certs.WebhookCerts, tmp_path: Path) -> None:
    out = tmp_path / "new" / "tls"
    written = certs.write_certs(made, out)

    assert {"ca.crt", "tls.crt", "tls.key"} == {p.name for p in out.iterdir()}
    assert {"ca.crt": out / "ca.crt", "tls.crt": out / "tls.crt", "tls.key": out / "tls.key"} == (
        written
    )
    assert made.ca_pem == (out / "ca.crt").read_bytes()
    assert made.cert_pem == (out / "tls.crt").read_bytes()
    assert made.key_pem == (out / "tls.key").read_bytes()
    assert mode(out / "tls.key") == 0o600
    assert mode(out / "tls.crt") == 0o644
    assert mode(out / "ca.crt") == 0o644
    assert mode(out) == 0o700


def test_rewriting_replaces_files_and_keeps_modes(made: certs.WebhookCerts, tmp_path: Path) -> None:
    (tmp_path / "tls.key").write_text("old")
    (tmp_path / "tls.key").chmod(0o644)
    certs.write_certs(made, tmp_path)
    again = certs.make_webhook_certs()
    certs.write_certs(again, tmp_path)

    assert again.key_pem == (tmp_path / "tls.key").read_bytes()
    assert mode(tmp_path / "tls.key") == 0o600
    assert {"ca.crt", "tls.crt", "tls.key"} == {p.name for p in tmp_path.iterdir()}


def test_out_that_is_a_file_is_refused(made: certs.WebhookCerts, tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(certs.CertsError, match="exists and is not a directory"):
        certs.write_certs(made, target)


def test_secret_manifest_is_a_tls_secret(made: certs.WebhookCerts) -> None:
    secret = yaml.safe_load(certs.secret_manifest(made))

    assert (
        secret["apiVersion"],
        secret["kind"],
        secret["type"],
    ) == ("v1", "Secret", "kubernetes.io/tls")
    assert secret["metadata"]["name"] == "resize-preemption-webhook-tls"
    assert secret["metadata"]["namespace"] == "resize-preemption-system"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert {"tls.crt": made.cert_pem, "tls.key": made.key_pem, "ca.crt": made.ca_pem} == data


def test_secret_manifest_rejects_a_bad_name(made: certs.WebhookCerts) -> None:
    with pytest.raises(certs.CertsError, match="secret name 'Bad_Name'"):
        certs.secret_manifest(made, name="Bad_Name")


def test_kustomize_patch_sets_the_ca_bundle_of_the_first_webhook(
    made: certs.WebhookCerts, tmp_path: Path
) -> None:
    path = certs.write_ca_bundle_patch(made, tmp_path)

    assert tmp_path / "ca-bundle.yaml" == path
    ops = yaml.safe_load(path.read_text())
    assert [
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": made.ca_bundle}
    ] == ops


# --- the command line -------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["certs", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_writes_files_and_prints_the_ca_bundle(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(
        capsys, "--out", str(tmp_path), "--ip", "192.168.1.5", "--dns", "rpw.example"
    )

    assert code == 0
    assert (tmp_path / "ca.crt").read_bytes() == base64.b64decode(out.strip())
    assert out.endswith("\n") and len(out.splitlines()) == 1
    assert f"wrote {tmp_path}/ca.crt, {tmp_path}/tls.crt, {tmp_path}/tls.key\n" == err
    dns, ips = sans(load((tmp_path / "tls.crt").read_bytes()))
    assert "rpw.example" in dns and ips == ["192.168.1.5"]
    assert mode(tmp_path / "tls.key") == 0o600


def test_cli_service_and_namespace_flags_name_the_certificate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, _ = run(capsys, "--out", str(tmp_path), "--service", "rpw", "--namespace", "ops")

    assert code == 0
    dns, _ = sans(load((tmp_path / "tls.crt").read_bytes()))
    assert dns == ["rpw", "rpw.ops", "rpw.ops.svc", "rpw.ops.svc.cluster.local"]


def test_cli_secret_yaml_prints_only_the_manifest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(
        capsys,
        "--out",
        str(tmp_path),
        "--secret-yaml",
        "--secret-name",
        "my-tls",
        "--namespace",
        "x",
    )

    assert code == 0
    secret = yaml.safe_load(out)
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == ("my-tls", "x")
    assert (tmp_path / "tls.key").read_bytes() == base64.b64decode(secret["data"]["tls.key"])


def test_cli_kustomize_patch_writes_the_patch_beside_the_certificates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "--out", str(tmp_path), "--kustomize-patch")

    assert code == 0
    ops = yaml.safe_load((tmp_path / "ca-bundle.yaml").read_text())
    assert out.strip() == ops[0]["value"]
    assert "ca-bundle.yaml" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ip", "not-an-ip"], "error: --ip 'not-an-ip' is not an IP address"),
        (["--dns", "under_score.example"], "error: --dns 'under_score.example' is not a valid"),
        (["--days", "0"], "error: --days must be between 1 and 3650, not 0"),
        (["--service", "Bad"], "error: service 'Bad' is not an RFC 1035 DNS label"),
        (["--secret-yaml", "--secret-name", "Bad"], "error: secret name 'Bad' is not a valid"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "--out", str(out_dir), *argv)

    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith(message)
    assert not out_dir.exists()


def test_cli_out_that_is_a_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    code, _, err = run(capsys, "--out", str(target))

    assert code == 2
    assert f"error: --out {target} exists and is not a directory\n" == err


def test_cli_without_out_writes_into_certs_of_the_working_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["certs"]) == 0
    assert ["ca.crt", "tls.crt", "tls.key"] == sorted(
        p.name for p in (tmp_path / "certs").iterdir()
    )
    assert "wrote certs/ca.crt" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["ca.crt", "tls.crt", "tls.key", "ca-bundle.yaml", "secret.yaml", "other.pem"]
)
def test_what_make_certs_writes_is_git_ignored_and_never_in_the_image(name: str) -> None:
    repo = Path(__file__).resolve().parents[2]
    ignored = subprocess.run(
        ["git", "check-ignore", "--quiet", f"certs/{name}"], cwd=repo, check=False
    )
    assert 0 == ignored.returncode
    docker = (repo / ".dockerignore").read_text().splitlines()
    assert "*" == docker[1] and not [line for line in docker if "certs" in line]


def test_the_certs_readme_is_not_ignored() -> None:
    repo = Path(__file__).resolve().parents[2]
    ignored = subprocess.run(["git", "check-ignore", "--quiet", "certs/README.md"], cwd=repo)
    assert 1 == ignored.returncode


def test_cli_patch_webhooks_without_a_usable_kubeconfig_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    code, out, err = run(
        capsys, "--out", str(tmp_path / "out"), "--patch-webhooks", "--kubeconfig", str(missing)
    )

    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith("wrote ")
    assert lines[1].startswith("error: cannot load Kubernetes client configuration")
    assert len(lines) == 2


def test_ip_addresses_are_real_ip_sans(made: certs.WebhookCerts) -> None:
    ext = load(made.cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert [ipaddress.ip_address("10.0.0.7")] == ext.value.get_values_for_type(x509.IPAddress)


# --- patching live webhook configurations (fake API) ------------------------------------


class FakeResponse:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeAdmissionApi:
    """Enough of AdmissionregistrationV1Api for webhookconfig, over a dict of objects."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.patches: list[tuple[str, str, list[dict[str, Any]], str]] = []
        self.fail_tests = 0

    def _read(self, kind: str, name: str) -> FakeResponse:
        if (kind, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return FakeResponse(self.objects[kind, name])

    def _patch(self, kind: str, name: str, ops: list[dict[str, Any]], content_type: str) -> None:
        self.patches.append((kind, name, ops, content_type))
        if self.fail_tests:
            self.fail_tests -= 1
            raise ApiException(status=422, reason="Unprocessable Entity")
        obj = self.objects[kind, name]
        for op in ops:
            index = int(op["path"].split("/")[2])
            if op["op"] == "test":
                assert obj["webhooks"][index]["name"] == op["value"]
            else:
                obj["webhooks"][index]["clientConfig"]["caBundle"] = op["value"]

    def read_validating_webhook_configuration(self, name: str, **_: Any) -> FakeResponse:
        return self._read("validating", name)

    def read_mutating_webhook_configuration(self, name: str, **_: Any) -> FakeResponse:
        return self._read("mutating", name)

    def patch_validating_webhook_configuration(
        self, name: str, body: list[dict[str, Any]], *, _content_type: str, **_: Any
    ) -> None:
        self._patch("validating", name, body, _content_type)

    def patch_mutating_webhook_configuration(
        self, name: str, body: list[dict[str, Any]], *, _content_type: str, **_: Any
    ) -> None:
        self._patch("mutating", name, body, _content_type)


def configuration(*names: str) -> dict[str, Any]:
    return {"webhooks": [{"name": n, "clientConfig": {"service": {"name": "x"}}} for n in names]}


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> FakeAdmissionApi:
    api = FakeAdmissionApi(
        {
            ("validating", "resize-preemption-webhook"): configuration("a.example.io"),
            ("mutating", "resize-preemption-webhook"): configuration("b.example.io", "c.x.io"),
        }
    )
    monkeypatch.setattr(webhookconfig, "AdmissionregistrationV1Api", lambda _client: api)
    return api


def test_patch_ops_test_each_name_then_set_the_bundle() -> None:
    ops = webhookconfig.ca_bundle_patch_ops(configuration("a.example.io", "b.example.io"), "Q0E=")

    assert ops == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a.example.io"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="},
        {"op": "test", "path": "/webhooks/1/name", "value": "b.example.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "Q0E="},
    ]


def test_set_ca_bundle_patches_every_webhook_of_both_kinds(fake_api: FakeAdmissionApi) -> None:
    outcomes = webhookconfig.set_ca_bundle(object(), "Q0E=")  # type: ignore[arg-type]

    assert [o.describe() for o in outcomes] == [
        "ValidatingWebhookConfiguration resize-preemption-webhook: caBundle set on a.example.io",
        "MutatingWebhookConfiguration resize-preemption-webhook: caBundle set on "
        "b.example.io, c.x.io",
    ]
    bundles = [
        w["clientConfig"]["caBundle"] for obj in fake_api.objects.values() for w in obj["webhooks"]
    ]
    assert bundles == ["Q0E="] * 3
    assert {p[3] for p in fake_api.patches} == {"application/json-patch+json"}


def test_a_missing_configuration_is_reported_not_raised(fake_api: FakeAdmissionApi) -> None:
    del fake_api.objects["mutating", "resize-preemption-webhook"]

    outcomes = webhookconfig.set_ca_bundle(object(), "Q0E=")  # type: ignore[arg-type]

    assert [o.found for o in outcomes] == [True, False]
    assert outcomes[1].describe().endswith(": not found")


def test_a_failed_test_op_is_retried_after_reading_again(fake_api: FakeAdmissionApi) -> None:
    fake_api.fail_tests = 2

    outcomes = webhookconfig.set_ca_bundle(
        object(),  # type: ignore[arg-type]
        "Q0E=",
        kinds=["ValidatingWebhookConfiguration"],
    )

    assert outcomes[0].webhooks == ("a.example.io",)
    assert len(fake_api.patches) == 3


def test_a_configuration_that_keeps_changing_is_an_error(fake_api: FakeAdmissionApi) -> None:
    fake_api.fail_tests = 10

    with pytest.raises(ClusterError, match="could not set the caBundle of Validating"):
        webhookconfig.set_ca_bundle(
            object(),  # type: ignore[arg-type]
            "Q0E=",
            kinds=["ValidatingWebhookConfiguration"],
        )


def test_forbidden_is_raised_as_a_cluster_error(fake_api: FakeAdmissionApi) -> None:
    def forbidden(name: str, **_: Any) -> None:
        raise ApiException(status=403, reason="Forbidden")

    fake_api.read_validating_webhook_configuration = forbidden  # type: ignore[method-assign,assignment]

    with pytest.raises(Forbidden):
        webhookconfig.set_ca_bundle(object(), "Q0E=")  # type: ignore[arg-type]
