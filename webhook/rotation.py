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

No I/O here.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from webhook import pki

CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
TLS_CERT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"
KEYS: Final = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)

DEFAULT_VALIDITY: Final = dt.timedelta(days=90)
DEFAULT_RENEW_BEFORE: Final = dt.timedelta(days=30)
DEFAULT_CA_VALIDITY: Final = dt.timedelta(days=3650)
#: How often the Secret is looked at, at most and at least.
MAX_PERIOD: Final = 60.0
MIN_PERIOD: Final = 1.0

#: A certificate made on a machine whose clock is a little ahead is still good.
_SKEW: Final = dt.timedelta(minutes=5)
#: What a certificate's lifetime may exceed its validity by: webhook.pki backdates the
#: start by five minutes.
_LIFETIME_SLACK: Final = dt.timedelta(minutes=6)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(d|h|m|s)")
_UNITS: Final = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str) -> dt.timedelta:
    """A duration as Go and cert-manager write them (``2160h``, ``1h30m``, ``90s``), days
    (``d``) too. Raises ``ValueError`` naming the text when it is not one, or not positive."""
    spelled = text.strip()
    parts = _DURATION.findall(spelled)
    if not parts or "".join(n + u for n, u in parts) != spelled:
        raise ValueError(f"{text!r} is not a duration such as 2160h, 45m or 90s")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return dt.timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    """Names and lifetimes of the service's own certificates."""

    dns_names: tuple[str, ...]
    validity: dt.timedelta = DEFAULT_VALIDITY
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY
    ca_name: str = "resize-preemption-webhook-ca"

    def problem(self) -> str | None:
        """Why the policy cannot work (one line), or None."""
        if not self.dns_names:
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

    def to_json(self) -> dict[str, object]:
        p = self.policy
        return {
            "secret": self.secret,
            "namespace": self.namespace,
            "webhook_configs": list(self.webhook_configs),
            "dns_names": list(p.dns_names),
            "validity": p.validity.total_seconds(),
            "renew_before": p.renew_before.total_seconds(),
            "ca_validity": p.ca_validity.total_seconds(),
            "cert_file": self.cert_file,
            "key_file": self.key_file,
        }

    @staticmethod
    def from_json(raw: Mapping[str, object]) -> ManagedTLS:
        def seconds(key: str) -> dt.timedelta:
            return dt.timedelta(seconds=float(str(raw[key])))

        def names(key: str) -> tuple[str, ...]:
            value = raw[key]
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        policy = RotationPolicy(
            dns_names=names("dns_names"),
            validity=seconds("validity"),
            renew_before=seconds("renew_before"),
            ca_validity=seconds("ca_validity"),
        )
        return ManagedTLS(
            secret=str(raw["secret"]),
            namespace=str(raw["namespace"]),
            webhook_configs=names("webhook_configs"),
            policy=policy,
            cert_file=str(raw["cert_file"]),
            key_file=str(raw["key_file"]),
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
    serving = (data.get(TLS_CERT, b""), data.get(TLS_KEY, b""))
    if not _serving_ok(serving, ca, policy, now):
        pair = pki.make_serving_cert(
            pki.CertificateAuthority(cert_pem=ca.pem, key_pem=ca.key_pem),
            dns_names=policy.dns_names,
            validity=policy.validity,
        )
        serving = (pair.cert_pem, pair.key_pem)
    wanted = {CA_CERT: ca_pem, CA_KEY: ca.key_pem, TLS_CERT: serving[0], TLS_KEY: serving[1]}
    return None if all(data.get(k) == v for k, v in wanted.items()) else wanted


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


def _serving_ok(
    pair: tuple[bytes, bytes], ca: _Authority, policy: RotationPolicy, now: dt.datetime
) -> bool:
    """Whether the serving pair is ``ca``'s, has every name, and is not due for renewal."""
    certs = _certificates(pair[0])
    key = _private_key(pair[1])
    if len(certs) != 1 or key is None or certs[0].public_key() != key.public_key():
        return False
    cert = certs[0]
    try:
        cert.verify_directly_issued_by(ca.cert)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (InvalidSignature, ValueError, TypeError, x509.ExtensionNotFound):
        return False
    missing = set(policy.dns_names) - set(names.get_values_for_type(x509.DNSName))
    due = _expires(cert) - now <= policy.renew_before or _longer(cert, policy.validity)
    return not missing and _valid(cert, now) and not due


def _longer(cert: x509.Certificate, validity: dt.timedelta) -> bool:
    """Whether ``cert`` lives longer than ``validity`` allows: the lifetime was shortened
    since it was made, and certificates follow."""
    return _expires(cert) - cert.not_valid_before_utc > validity + _LIFETIME_SLACK


__all__ = [
    "CA_CERT",
    "CA_KEY",
    "KEYS",
    "TLS_CERT",
    "TLS_KEY",
    "ManagedTLS",
    "RotationPolicy",
    "parse_duration",
    "renewal",
]
