"""Small X.509 helpers: a certificate authority and the serving and client certificates it
signs.

Everything is returned as PEM bytes so callers can write files, build kubeconfigs or fill a
``caBundle`` without touching ``cryptography`` themselves. Keys are ECDSA P-256: quick to
generate (tests make several per run) and accepted by Go's TLS stack and by kube-apiserver
for client certificates and service-account token signing.

This module does no I/O.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "DEFAULT_VALIDITY",
    "CertificateAuthority",
    "KeyPair",
    "issue",
    "key_to_pem",
    "make_ca",
    "make_client_cert",
    "make_serving_cert",
]

DEFAULT_VALIDITY = dt.timedelta(days=365)
# Clocks of the machine and of a container can disagree a little; backdating avoids
# "certificate is not yet valid" right after creation.
_BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True, slots=True)
class CertificateAuthority(KeyPair):
    """A self-signed CA able to sign further certificates."""


def make_ca(common_name: str, *, validity: dt.timedelta = DEFAULT_VALIDITY) -> CertificateAuthority:
    """Create a self-signed CA certificate valid for ``validity`` from now."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key, validity, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=key_to_pem(key)
    )


def make_serving_cert(
    ca: CertificateAuthority,
    *,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    common_name: str | None = None,
    validity: dt.timedelta = DEFAULT_VALIDITY,
) -> KeyPair:
    """Create a TLS server certificate signed by ``ca``.

    At least one DNS name or IP address is required: Go clients (kube-apiserver calling a
    webhook) verify only the subjectAltName, never the common name.
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    cn = common_name or (dns_names[0] if dns_names else ip_addresses[0])
    return issue(
        ca,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
        validity=validity,
    )


def make_client_cert(
    ca: CertificateAuthority,
    common_name: str,
    *,
    validity: dt.timedelta = DEFAULT_VALIDITY,
) -> KeyPair:
    """Create a TLS client certificate (extended key usage clientAuth, no
    subjectAltName) for ``common_name``, signed by ``ca``."""
    return issue(
        ca,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        sans=[],
        validity=validity,
    )


def issue(
    ca: CertificateAuthority,
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    validity: dt.timedelta,
) -> KeyPair:
    """A certificate for ``subject`` with extended key ``usage``, signed by ``ca``."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the CA key must be an ECDSA key made by make_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(subject, ca_cert.subject, key, validity, ca=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=key_to_pem(key))


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    validity: dt.timedelta,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """A builder of ``key``'s certificate, valid for ``validity`` from a little before now.

    A CA's key may sign certificates and revocation lists; any other key only digital
    signatures (the TLS handshake's, all a serving or client certificate needs).
    """
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
