"""Certificates only the local control plane needs: client certificates (the admin's, a
user's) and the service-account signing key, on top of :mod:`webhook.tls.pki`'s CA."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.tls.pki import DEFAULT_VALIDITY, CertificateAuthority, KeyPair, issue, key_to_pem


def generate_private_key_pem() -> bytes:
    """Return a fresh ECDSA P-256 private key as PKCS#8 PEM."""
    return key_to_pem(ec.generate_private_key(ec.SECP256R1()))


def public_key_pem(private_key_pem: bytes) -> bytes:
    """Return the SubjectPublicKeyInfo PEM of ``private_key_pem``."""
    key = serialization.load_pem_private_key(private_key_pem, password=None)
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def make_client_cert(
    ca: CertificateAuthority,
    common_name: str,
    *,
    groups: Sequence[str] = (),
    validity: dt.timedelta = DEFAULT_VALIDITY,
) -> KeyPair:
    """Create a TLS client certificate signed by ``ca``.

    Kubernetes maps the common name to the user name and each organization (O) to a group,
    so ``groups=["system:masters"]`` yields a cluster administrator.
    """
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return issue(
        ca,
        subject=x509.Name(attributes),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        sans=[],
        validity=validity,
    )


__all__ = ["generate_private_key_pem", "make_client_cert", "public_key_pem"]
