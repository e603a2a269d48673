"""kube-apiserver's client certificate in certificates mode ``service``: what its Secret
should hold (webhook.tls.rotation with the client policy), the CA file the service trusts
(webhook.kube.certs.write_client_ca) and the review port following that file
(webhook.tls.serving). The cluster side - the Secret written with the chart's rights, a
review with the certificate accepted and one without refused - is
tests/e2e/test_apiserver_client_cert.py."""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.unit.web_fixtures import make_tls_files
from webhook.kube.certs import write_client_ca
from webhook.tls import pki
from webhook.tls.rotation import (
    CA_CERT,
    CA_KEY,
    CLIENT_CA_NAME,
    CLIENT_NAME,
    TLS_CERT,
    TLS_KEY,
    ManagedClient,
    ManagedTLS,
    RotationPolicy,
    client_policy,
    renewal,
)
from webhook.tls.serving import CertificateReloader

POLICY = client_policy(
    validity=dt.timedelta(days=365),
    renew_before=dt.timedelta(days=30),
    ca_validity=dt.timedelta(days=3650),
)
SERVING = RotationPolicy(dns_names=("svc.ns.svc",))

Data = dict[str, bytes]


def now() -> dt.datetime:
    """Read at each use: the pki stamps certificates with the real clock."""
    return dt.datetime.now(dt.UTC)


def made() -> Data:
    data = renewal({}, POLICY, now())
    assert data is not None
    return data


def cert(data: Data) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[TLS_CERT])


def bundle(data: Data) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data[CA_CERT])


def trusted(certificate: x509.Certificate, cas: list[x509.Certificate]) -> bool:
    """Whether one of ``cas`` signed ``certificate``."""
    for ca in cas:
        try:
            certificate.verify_directly_issued_by(ca)
        except Exception:
            continue
        return True
    return False


def test_nothing_makes_a_ca_and_a_client_certificate_for_kube_apiserver() -> None:
    data = made()
    assert [CA_CERT, CA_KEY, TLS_CERT, TLS_KEY] == sorted(data)
    (ca,) = bundle(data)
    assert CLIENT_CA_NAME == ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    client = cert(data)
    assert [CLIENT_NAME] == [
        a.value for a in client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ]
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [ExtendedKeyUsageOID.CLIENT_AUTH] == list(usages)
    assert False is client.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    with pytest.raises(x509.ExtensionNotFound):
        client.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert trusted(client, [ca])
    # A year, begun five minutes early (clock skew).
    assert dt.timedelta(days=365, minutes=5) == client.not_valid_after_utc - (
        client.not_valid_before_utc
    )


def test_what_is_current_is_left_alone() -> None:
    data = made()
    assert None is renewal(data, POLICY, now())
    assert None is renewal(data, POLICY, now() + dt.timedelta(days=334))


def _serving_pair(data: Data) -> Data:
    """The pair replaced by a serving certificate the same CA signed."""
    ca = pki.CertificateAuthority(cert_pem=data[CA_CERT], key_pem=data[CA_KEY])
    pair = pki.make_serving_cert(ca, dns_names=["svc.ns.svc"], validity=POLICY.validity)
    return {**data, TLS_CERT: pair.cert_pem, TLS_KEY: pair.key_pem}


def _other_subject(data: Data) -> Data:
    ca = pki.CertificateAuthority(cert_pem=data[CA_CERT], key_pem=data[CA_KEY])
    pair = pki.make_client_cert(ca, "someone-else", validity=POLICY.validity)
    return {**data, TLS_CERT: pair.cert_pem, TLS_KEY: pair.key_pem}


#: (id, the Secret's data changed, the time, new CA?, new certificate?)
CASES: list[tuple[str, Callable[[Data], Data], dt.timedelta, bool, bool]] = [
    ("in-the-renewal-margin", lambda d: d, dt.timedelta(days=336), False, True),
    ("expired", lambda d: d, dt.timedelta(days=366), False, True),
    ("a-serving-certificate", _serving_pair, dt.timedelta(0), False, True),
    ("another-subject", _other_subject, dt.timedelta(0), False, True),
    ("ca-would-not-outlive-a-certificate", lambda d: d, dt.timedelta(days=3650 - 364),
     True, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "later", "new_ca", "new_cert"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_what_is_renewed(
    change: Callable[[Data], Data], later: dt.timedelta, new_ca: bool, new_cert: bool
) -> None:
    before = change(made())
    after = renewal(before, POLICY, now() + later)
    assert after is not None
    assert (new_ca, new_cert) == (
        after[CA_KEY] != before[CA_KEY],
        after[TLS_CERT] != before[TLS_CERT],
    )
    assert trusted(cert(after), bundle(after)[:1])


def test_the_copy_kube_apiserver_holds_stays_trusted_through_a_new_ca() -> None:
    """The CA renewed: the certificate the control plane still presents is signed by the
    old CA, which stays in ``ca.crt`` (what the service trusts) until it expires."""
    first = made()
    old_ca = bundle(first)[0]
    late = old_ca.not_valid_after_utc - POLICY.validity + dt.timedelta(seconds=1)
    second = renewal(first, POLICY, late)
    assert second is not None
    assert [False, True, True] == [
        bundle(second)[0] == old_ca,
        old_ca in bundle(second),
        trusted(cert(first), bundle(second)),
    ]


def test_the_client_policy_needs_no_dns_name_and_checks_its_lifetimes() -> None:
    short_ca = client_policy(validity=dt.timedelta(days=365), ca_validity=dt.timedelta(days=400))
    assert [None, "the CA's validity must be at least twice the certificate's"] == [
        POLICY.problem(),
        short_ca.problem(),
    ]


def test_managed_tls_with_a_client_survives_its_json() -> None:
    tls = ManagedTLS(
        "s", "ns", ("a",), SERVING, "/t/tls.crt", "/t/tls.key",
        client=ManagedClient("s-apiserver-client", "/t/client-ca.crt", POLICY),
    )  # fmt: skip
    assert tls == ManagedTLS.from_json(tls.to_json())


def test_the_client_secrets_ca_is_written_for_the_review_port_once(tmp_path: Path) -> None:
    ca_file = tmp_path / "client-ca" / "ca.crt"
    tls = ManagedTLS(
        "s", "ns", ("a",), SERVING, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"),
        client=ManagedClient("c", str(ca_file), POLICY),
    )  # fmt: skip
    data = made()
    assert [True, False] == [write_client_ca(data, tls), write_client_ca(data, tls)]
    assert data[CA_CERT] == ca_file.read_bytes()
    without = ManagedTLS("s", "ns", ("a",), SERVING, tls.cert_file, tls.key_file)
    assert False is write_client_ca(data, without)


def _subjects(context: ssl.SSLContext) -> list[str]:
    return sorted(str(dict(n[0] for n in c["subject"])["commonName"]) for c in
                  context.get_ca_certs())  # fmt: skip


def test_the_review_port_trusts_a_new_ca_written_to_the_file(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    ca_file = tmp_path / "client-ca.crt"
    first = pki.make_ca("first")
    ca_file.write_bytes(first.cert_pem)
    reloader = CertificateReloader(
        str(files.cert_file), str(files.key_file), check_interval=0, client_ca=str(ca_file)
    )
    assert ["first"] == _subjects(reloader.context())
    second = pki.make_ca("second")
    ca_file.write_bytes(second.cert_pem + first.cert_pem)
    assert ["first", "second"] == _subjects(reloader.context())
    # The probe port still asks for no certificate.
    assert ssl.CERT_NONE == reloader.context(probes=True).verify_mode


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
SERVE = ["serve", "--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"]
KEPT = ["--tls-secret", "s", "--tls-dns", "x"]
BAD_FLAGS = [
    ("without-tls-secret", ["--tls-client-secret", "c", "--client-ca", "/x/ca.crt"],
     "error: --tls-client-secret needs --tls-secret"),
    ("without-client-ca", [*KEPT, "--tls-client-secret", "c"],
     "error: --tls-client-secret needs client-ca: the file its CA is written to"),
    ("margin-too-long", [*KEPT, "--tls-client-secret", "c", "--client-ca", "/x/ca.crt",
                         "--tls-client-validity", "1h", "--tls-client-renew-before", "2h"],
     "error: --tls-client-secret: the renewal margin must be shorter than the certificate's "
     "validity (--tls-client-validity, --tls-client-renew-before, --tls-ca-validity)"),
    ("not-a-duration", ["--tls-client-validity", "1y"],
     "error: argument --tls-client-validity: '1y' is not a duration such as 2160h, 45m or "
     "90s (see python -m webhook serve --help)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "line"), [b[1:] for b in BAD_FLAGS], ids=[b[0] for b in BAD_FLAGS]
)
def test_serve_refuses_client_certificate_flags_that_cannot_work(
    flags: list[str], line: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from webhook.cli import main

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    try:
        code = main([*SERVE, "--kubeconfig", str(kubeconfig), *flags])
    except SystemExit as e:  # argparse's own refusal
        code = int(str(e.code))
    assert (2, line) == (code, capsys.readouterr().err.strip().splitlines()[-1])
