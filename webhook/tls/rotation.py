"""The service's own certificates: what its Secret should hold, decided from what it holds.

In the chart's default certificates mode (``service``) nobody hands the webhook a
certificate. The service keeps a private CA and a serving certificate in one Secret of its
namespace (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``), sets ``ca.crt`` as the
``caBundle`` of its webhook configurations, and renews both before they expire
(:mod:`webhook.kube.certs` does the I/O). This module only decides, from the Secret's data
and the time, whether and what to write - the way Gatekeeper's cert-controller and
Kyverno's certificate renewer decide:

* the serving certificate is renewed ``renew_before`` its expiry, when it lacks one of the
  Service's names, when the current CA did not sign it, or when it lives longer than the
  validity now asked for; the CA stays, so such a renewal
  never changes the ``caBundle``;
* the CA is renewed once it would not outlive a new serving certificate; ``ca.crt`` then
  holds the new CA first and every earlier one still valid, so the API server trusts the
  certificate every replica serves while they move to the new one;
* anything missing, unreadable or not matching its key is made anew.

With client certificates required (``client-ca``), a second Secret of the same shape holds
a CA of its own and kube-apiserver's client certificate (:class:`ManagedClient`, the
policy's ``client_name``): the same decisions, for a certificate whose extended key usage
is clientAuth and whose subject is that name. The service trusts that Secret's ``ca.crt``
for reviews; kube-apiserver presents ``tls.crt`` and ``tls.key``, copied to the control
plane by its operator (docs/deploy.md "Authenticating the API server"). A renewed client
certificate is signed by the same CA, and a renewed CA stays in ``ca.crt`` until it
expires, so the copy kube-apiserver holds is accepted until its own expiry.

No I/O here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.base.settings import DEFAULT_CLIENT_CN, DURATION
from webhook.tls import pki

CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
TLS_CERT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"
KEYS: Final = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)

DEFAULT_VALIDITY: Final = dt.timedelta(days=90)
DEFAULT_RENEW_BEFORE: Final = dt.timedelta(days=30)
DEFAULT_CA_VALIDITY: Final = dt.timedelta(days=3650)
DEFAULT_CA_NAME: Final = "resize-preemption-webhook-ca"
#: How often the Secret is looked at, at most and at least.
MAX_PERIOD: Final = 60.0
MIN_PERIOD: Final = 1.0

#: A certificate made on a machine whose clock is a little ahead is still good.
_SKEW: Final = dt.timedelta(minutes=5)
#: What a certificate's lifetime may exceed its validity by: webhook.tls.pki backdates the
#: start by five minutes.
_LIFETIME_SLACK: Final = dt.timedelta(minutes=6)


def parse_duration(text: str) -> dt.timedelta:
    """A duration as Go and cert-manager write them (``2160h``, ``1h30m``, ``90s``), days
    (``d``) too. Raises ``ValueError`` naming the text when it is not one, or not positive."""
    return DURATION(text)


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    """Names and lifetimes of the service's own certificates."""

    dns_names: tuple[str, ...]
    validity: dt.timedelta = DEFAULT_VALIDITY
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY
    ca_name: str = DEFAULT_CA_NAME
    #: Not empty: the certificate is a client certificate (clientAuth) with this common
    #: name, and ``dns_names`` go unused; empty: a serving certificate for ``dns_names``.
    client_name: str = ""

    def problem(self) -> str | None:
        """Why the policy cannot work (one line), or None."""
        if not self.dns_names and not self.client_name:
            return "a serving certificate needs at least one DNS name"
        if self.renew_before >= self.validity:
            return "the renewal margin must be shorter than the certificate's validity"
        if self.ca_validity < 2 * self.validity:
            return "the CA's validity must be at least twice the certificate's"
        return None

    @property
    def period(self) -> float:
        """Seconds between two looks at the Secret: several per renewal margin, so a
        certificate is renewed and served well before it expires."""
        return min(MAX_PERIOD, max(MIN_PERIOD, self.renew_before.total_seconds() / 6))


#: kube-apiserver's client certificate: its subject (the ``client-cn`` the review port
#: asks for by default) and its CA's.
CLIENT_NAME: Final = DEFAULT_CLIENT_CN
CLIENT_CA_NAME: Final = "resize-preemption-webhook-apiserver-client-ca"
DEFAULT_CLIENT_VALIDITY: Final = dt.timedelta(days=365)


def client_policy(
    validity: dt.timedelta = DEFAULT_CLIENT_VALIDITY,
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE,
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY,
    name: str = CLIENT_NAME,
) -> RotationPolicy:
    """The policy of kube-apiserver's client certificate, issued for ``name`` (the
    ``client-cn`` the review port asks for)."""
    return RotationPolicy(
        dns_names=(),
        validity=validity,
        renew_before=renew_before,
        ca_validity=ca_validity,
        ca_name=CLIENT_CA_NAME,
        client_name=name,
    )


@dataclass(frozen=True, slots=True)
class ManagedClient:
    """Where the service keeps kube-apiserver's client certificate: the Secret ``secret``
    of the service's namespace, and the file of the CA it trusts for reviews
    (``client-ca``)."""

    secret: str
    ca_file: str
    policy: RotationPolicy


def _policy_json(policy: RotationPolicy) -> dict[str, object]:
    return {
        "dns_names": list(policy.dns_names),
        "validity": policy.validity.total_seconds(),
        "renew_before": policy.renew_before.total_seconds(),
        "ca_validity": policy.ca_validity.total_seconds(),
        "ca_name": policy.ca_name,
        "client_name": policy.client_name,
    }


def _names(raw: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = raw.get(key)
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _policy_from(raw: Mapping[str, object]) -> RotationPolicy:
    def seconds(key: str) -> dt.timedelta:
        return dt.timedelta(seconds=float(str(raw[key])))

    return RotationPolicy(
        dns_names=_names(raw, "dns_names"),
        validity=seconds("validity"),
        renew_before=seconds("renew_before"),
        ca_validity=seconds("ca_validity"),
        ca_name=str(raw.get("ca_name") or DEFAULT_CA_NAME),
        client_name=str(raw.get("client_name") or ""),
    )


def _client_json(client: ManagedClient) -> dict[str, object]:
    return {"secret": client.secret, "ca_file": client.ca_file, **_policy_json(client.policy)}


def _client_from(raw: Mapping[str, object]) -> ManagedClient:
    return ManagedClient(str(raw["secret"]), str(raw["ca_file"]), _policy_from(raw))


@dataclass(frozen=True, slots=True)
class ManagedTLS:
    """Where the service keeps its own certificates: the Secret ``namespace/secret``, the
    webhook configurations whose ``caBundle`` it sets, and the files it serves from."""

    secret: str
    namespace: str
    webhook_configs: tuple[str, ...]
    policy: RotationPolicy
    cert_file: str
    key_file: str
    #: kube-apiserver's client certificate, when reviews need one; None: they do not, or
    #: its CA comes from elsewhere.
    client: ManagedClient | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "secret": self.secret,
            "namespace": self.namespace,
            "webhook_configs": list(self.webhook_configs),
            **_policy_json(self.policy),
            "cert_file": self.cert_file,
            "key_file": self.key_file,
            "client": None if self.client is None else _client_json(self.client),
        }

    @staticmethod
    def from_json(raw: Mapping[str, object]) -> ManagedTLS:
        client = raw.get("client")
        return ManagedTLS(
            secret=str(raw["secret"]),
            namespace=str(raw["namespace"]),
            webhook_configs=_names(raw, "webhook_configs"),
            policy=_policy_from(raw),
            cert_file=str(raw["cert_file"]),
            key_file=str(raw["key_file"]),
            client=_client_from(client) if isinstance(client, Mapping) else None,
        )


@dataclass(frozen=True, slots=True)
class _Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    pem: bytes
    key_pem: bytes


def renewal(
    data: Mapping[str, bytes], policy: RotationPolicy, now: dt.datetime
) -> dict[str, bytes] | None:
    """The Secret data to write instead of ``data``, or None when ``data`` is good as it is."""
    bundle = [c for c in _certificates(data.get(CA_CERT, b"")) if _valid(c, now)]
    ca = _authority(data, bundle)
    if (
        ca is None
        or _expires(ca.cert) - now < policy.validity
        or _longer(ca.cert, policy.ca_validity)
    ):
        made = pki.make_ca(policy.ca_name, validity=policy.ca_validity)
        ca = _authority({CA_KEY: made.key_pem}, _certificates(made.cert_pem))
        assert ca is not None
        bundle = [ca.cert, *(c for c in bundle if c != ca.cert)]
    ca_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in bundle)
    leaf = (data.get(TLS_CERT, b""), data.get(TLS_KEY, b""))
    if not _leaf_ok(leaf, ca, policy, now):
        leaf = _issue(ca, policy)
    wanted = {CA_CERT: ca_pem, CA_KEY: ca.key_pem, TLS_CERT: leaf[0], TLS_KEY: leaf[1]}
    return None if all(data.get(k) == v for k, v in wanted.items()) else wanted


def _issue(ca: _Authority, policy: RotationPolicy) -> tuple[bytes, bytes]:
    """A new certificate and key as ``policy`` asks, signed by ``ca``."""
    authority = pki.CertificateAuthority(cert_pem=ca.pem, key_pem=ca.key_pem)
    if policy.client_name:
        pair = pki.make_client_cert(authority, policy.client_name, validity=policy.validity)
    else:
        pair = pki.make_serving_cert(
            authority, dns_names=policy.dns_names, validity=policy.validity
        )
    return pair.cert_pem, pair.key_pem


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem) if pem else []
    except ValueError:
        return []


def _expires(cert: x509.Certificate) -> dt.datetime:
    return cert.not_valid_after_utc


def _valid(cert: x509.Certificate, now: dt.datetime) -> bool:
    return cert.not_valid_before_utc <= now + _SKEW and now < _expires(cert)


def _private_key(pem: bytes) -> ec.EllipticCurvePrivateKey | None:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _authority(data: Mapping[str, bytes], bundle: Sequence[x509.Certificate]) -> _Authority | None:
    """The bundle's first certificate with ``ca.key`` as its key, when it is a CA's."""
    key = _private_key(data.get(CA_KEY, b""))
    if not bundle or key is None:
        return None
    cert = bundle[0]
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return None
    if not constraints.ca or cert.public_key() != key.public_key():
        return None
    return _Authority(cert, key, cert.public_bytes(serialization.Encoding.PEM), pki.key_to_pem(key))


def _leaf_ok(
    pair: tuple[bytes, bytes], ca: _Authority, policy: RotationPolicy, now: dt.datetime
) -> bool:
    """Whether the pair is ``ca``'s, is what ``policy`` asks for, and is not due for
    renewal."""
    certs = _certificates(pair[0])
    key = _private_key(pair[1])
    if len(certs) != 1 or key is None or certs[0].public_key() != key.public_key():
        return False
    cert = certs[0]
    try:
        cert.verify_directly_issued_by(ca.cert)
        fits = _client_fits(cert, policy) if policy.client_name else _serving_fits(cert, policy)
    except (InvalidSignature, ValueError, TypeError, x509.ExtensionNotFound):
        return False
    due = _expires(cert) - now <= policy.renew_before or _longer(cert, policy.validity)
    return fits and _valid(cert, now) and not due


def _serving_fits(cert: x509.Certificate, policy: RotationPolicy) -> bool:
    """Whether ``cert`` names every DNS name of ``policy``."""
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(policy.dns_names) <= set(names.get_values_for_type(x509.DNSName))


def _client_fits(cert: x509.Certificate, policy: RotationPolicy) -> bool:
    """Whether ``cert`` is a client certificate for ``policy``'s name."""
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    subject = [str(n.value) for n in names]
    return ExtendedKeyUsageOID.CLIENT_AUTH in usages and [policy.client_name] == subject


def _longer(cert: x509.Certificate, validity: dt.timedelta) -> bool:
    """Whether ``cert`` lives longer than ``validity`` allows: the lifetime was shortened
    since it was made, and certificates follow."""
    return _expires(cert) - cert.not_valid_before_utc > validity + _LIFETIME_SLACK


__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CLIENT_CA_NAME",
    "CLIENT_NAME",
    "DEFAULT_CLIENT_VALIDITY",
    "KEYS",
    "TLS_CERT",
    "TLS_KEY",
    "ManagedClient",
    "ManagedTLS",
    "RotationPolicy",
    "client_policy",
    "parse_duration",
    "renewal",
]
