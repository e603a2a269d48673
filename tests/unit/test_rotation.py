"""webhook.tls.rotation: what the service's Secret should hold, decided from what it holds and
the time (the chart's certificates mode ``service``). The cluster side - the Secret, the
caBundle, the ServiceAccount's rights - is tests/e2e/test_certificates.py and, on the real
node, tests/e2e/test_realnode_install.py."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509

from webhook.tls import pki
from webhook.tls.rotation import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    ManagedTLS,
    RotationPolicy,
    parse_duration,
    renewal,
)

NAMES = ("svc.ns.svc", "svc.ns.svc.cluster.local")
POLICY = RotationPolicy(
    dns_names=NAMES,
    validity=dt.timedelta(days=90),
    renew_before=dt.timedelta(days=30),
    ca_validity=dt.timedelta(days=3650),
)


def now() -> dt.datetime:
    """The time as the certificates made in a test see it: read at each use, since the
    pki stamps a certificate with the real clock (a time read at import would fall before
    the certificates of a test run many minutes later)."""
    return dt.datetime.now(dt.UTC)


Data = dict[str, bytes]


def made() -> Data:
    data = renewal({}, POLICY, now())
    assert data is not None
    return data


def cert(data: Data, key: str = TLS_CERT) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[key])


def bundle(data: Data) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data[CA_CERT])


def signed_by(data: Data, ca: x509.Certificate) -> bool:
    try:
        cert(data).verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def test_nothing_makes_a_ca_and_a_certificate_it_signed_for_every_name() -> None:
    data = made()
    assert [CA_CERT, CA_KEY, TLS_CERT, TLS_KEY] == sorted(data)
    ca = bundle(data)
    assert 1 == len(ca)
    assert True is ca[0].extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert signed_by(data, ca[0])
    names = cert(data).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(NAMES) == names.get_values_for_type(x509.DNSName)
    # 90 days, begun five minutes early (clock skew).
    lifetime = cert(data).not_valid_after_utc - cert(data).not_valid_before_utc
    assert dt.timedelta(days=90, minutes=5) == lifetime


def test_what_is_current_is_left_alone() -> None:
    data = made()
    assert None is renewal(data, POLICY, now())
    assert None is renewal(data, POLICY, now() + dt.timedelta(days=59))


def _other_key(data: Data) -> Data:
    return {**data, TLS_KEY: made()[TLS_KEY]}


def _garbage(data: Data) -> Data:
    return {k: b"not PEM" for k in data}


def _no_ca_key(data: Data) -> Data:
    return {k: v for k, v in data.items() if k != CA_KEY}


#: (id, the Secret's data changed, the time, the policy, new CA?, new certificate?)
CASES: list[tuple[str, Callable[[Data], Data], dt.timedelta, RotationPolicy, bool, bool]] = [
    ("in-the-renewal-margin", lambda d: d, dt.timedelta(days=61), POLICY, False, True),
    ("expired", lambda d: d, dt.timedelta(days=91), POLICY, False, True),
    ("a-name-added", lambda d: d, dt.timedelta(0),
     RotationPolicy(dns_names=(*NAMES, "svc"), validity=POLICY.validity,
                    renew_before=POLICY.renew_before), False, True),
    ("validity-shortened", lambda d: d, dt.timedelta(0),
     RotationPolicy(dns_names=NAMES, validity=dt.timedelta(days=10),
                    renew_before=dt.timedelta(days=3)), False, True),
    ("key-not-the-certificates", _other_key, dt.timedelta(0), POLICY, False, True),
    ("ca-key-missing", _no_ca_key, dt.timedelta(0), POLICY, True, True),
    ("unreadable", _garbage, dt.timedelta(0), POLICY, True, True),
    ("ca-would-not-outlive-a-certificate", lambda d: d, dt.timedelta(days=3650 - 89), POLICY,
     True, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "later", "policy", "new_ca", "new_cert"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_what_is_renewed(
    change: Callable[[Data], Data],
    later: dt.timedelta,
    policy: RotationPolicy,
    new_ca: bool,
    new_cert: bool,
) -> None:
    before = change(made())
    after = renewal(before, policy, now() + later)
    assert after is not None
    assert (new_ca, new_cert) == (
        after[CA_KEY] != before.get(CA_KEY),
        after[TLS_CERT] != before[TLS_CERT],
    )
    assert signed_by(after, bundle(after)[0])


def test_a_new_ca_keeps_the_old_one_trusted_until_it_expires() -> None:
    first = made()
    old_ca = bundle(first)[0]
    late = old_ca.not_valid_after_utc - POLICY.validity + dt.timedelta(seconds=1)
    second = renewal(first, POLICY, late)
    assert second is not None
    assert [False, old_ca] == [bundle(second)[0] == old_ca, bundle(second)[1]]
    assert signed_by(second, bundle(second)[0])


def test_an_expired_ca_leaves_the_bundle() -> None:
    current = made()
    expired = pki.make_ca("old", validity=dt.timedelta(seconds=1))
    time.sleep(1.1)
    with_expired = {**current, CA_CERT: current[CA_CERT] + expired.cert_pem}
    after = renewal(with_expired, POLICY, dt.datetime.now(dt.UTC))
    assert after is not None
    assert (current[CA_CERT], current[TLS_CERT]) == (after[CA_CERT], after[TLS_CERT])


DURATIONS = [
    ("2160h", dt.timedelta(hours=2160)),
    ("1h30m", dt.timedelta(minutes=90)),
    ("90s", dt.timedelta(seconds=90)),
    ("1.5h", dt.timedelta(minutes=90)),
    ("10d", dt.timedelta(days=10)),
]


@pytest.mark.parametrize(("text", "expected"), DURATIONS, ids=[d[0] for d in DURATIONS])
def test_durations_as_go_writes_them(text: str, expected: dt.timedelta) -> None:
    assert expected == parse_duration(text)


BAD_DURATIONS = [
    ("", "'' is not a duration such as 2160h, 45m or 90s"),
    ("10", "'10' is not a duration such as 2160h, 45m or 90s"),
    ("5 m", "'5 m' is not a duration such as 2160h, 45m or 90s"),
    ("-5m", "'-5m' is not a duration such as 2160h, 45m or 90s"),
    ("0s", "'0s': a duration must be positive"),
]


@pytest.mark.parametrize(
    ("text", "message"), BAD_DURATIONS, ids=[d[0] or "empty" for d in BAD_DURATIONS]
)
def test_bad_durations_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_duration(text)
    assert message == str(refused.value)


H = dt.timedelta(hours=1)
PROBLEMS = [
    ("good", RotationPolicy(dns_names=NAMES), None),
    ("no-names", RotationPolicy(dns_names=()),
     "a serving certificate needs at least one DNS name"),
    ("margin-as-long-as-validity", RotationPolicy(dns_names=NAMES, validity=H, renew_before=H),
     "the renewal margin must be shorter than the certificate's validity"),
    ("ca-too-short", RotationPolicy(dns_names=NAMES, validity=10 * H, renew_before=H,
                                    ca_validity=15 * H),
     "the CA's validity must be at least twice the certificate's"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "problem"), [p[1:] for p in PROBLEMS], ids=[p[0] for p in PROBLEMS]
)
def test_policies_that_cannot_work_are_named(policy: RotationPolicy, problem: str | None) -> None:
    assert problem == policy.problem()


@pytest.mark.parametrize(
    ("renew_before", "period"),
    [
        (dt.timedelta(days=30), 60.0),
        (dt.timedelta(seconds=90), 15.0),
        (dt.timedelta(seconds=3), 1.0),
    ],
    ids=["capped", "a-sixth-of-the-margin", "floor"],
)
def test_the_secret_is_looked_at_several_times_per_margin(
    renew_before: dt.timedelta, period: float
) -> None:
    assert period == RotationPolicy(dns_names=NAMES, renew_before=renew_before).period


def test_managed_tls_survives_its_json() -> None:
    tls = ManagedTLS("s", "ns", ("a", "b"), POLICY, "/t/tls.crt", "/t/tls.key")
    assert tls == ManagedTLS.from_json(tls.to_json())


def test_a_ca_made_by_pki_is_a_valid_ca_for_renewal() -> None:
    ca = pki.make_ca("x")
    pair = pki.make_serving_cert(ca, dns_names=NAMES, validity=POLICY.validity)
    data = {
        CA_CERT: ca.cert_pem,
        CA_KEY: ca.key_pem,
        TLS_CERT: pair.cert_pem,
        TLS_KEY: pair.key_pem,
    }
    assert None is renewal(data, POLICY, now())


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
SERVE = ["serve", "--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"]
BAD_FLAGS = [
    ("no-names", ["--tls-secret", "s"],
     "error: --tls-secret: a serving certificate needs at least one DNS name "
     "(--tls-dns, --tls-validity, ...)"),
    ("margin-too-long", ["--tls-secret", "s", "--tls-dns", "x", "--tls-validity", "1h",
                         "--tls-renew-before", "2h"],
     "error: --tls-secret: the renewal margin must be shorter than the certificate's "
     "validity (--tls-dns, --tls-validity, ...)"),
    ("not-a-duration", ["--tls-validity", "5x"],
     "error: argument --tls-validity: '5x' is not a duration such as 2160h, 45m or 90s "
     "(see python -m webhook serve --help)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "line"), [b[1:] for b in BAD_FLAGS], ids=[b[0] for b in BAD_FLAGS]
)
def test_serve_refuses_certificate_flags_that_cannot_work_before_anything_starts(
    flags: list[str], line: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from webhook.cli import main

    # A kubeconfig that reads, so that the certificate flags are the one mistake left.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    try:
        code = main([*SERVE, "--kubeconfig", str(kubeconfig), *flags])
    except SystemExit as e:  # argparse's own refusal
        code = int(str(e.code))
    assert (2, line) == (code, capsys.readouterr().err.strip().splitlines()[-1])
