"""Certificates for running the webhook without cert-manager (``python -m webhook certs``).

Makes a private CA and a serving certificate it signs, with subjectAltNames for every name
the API server may use to reach the webhook's Service (``<svc>``, ``<svc>.<ns>``,
``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.cluster.local``) plus extra DNS names and IP
addresses (a webhook run outside the cluster, reached by URL). Renders what the cluster
needs from them: the base64 ``caBundle``, a ``kubernetes.io/tls`` Secret manifest and a
kustomize patch setting the ``caBundle`` (``deploy/overlays/self-signed``).

The CA's private key is never written: each run makes a new CA, so re-running rotates both
certificates and the ``caBundle`` together.

No Kubernetes client here; patching live webhook configurations is
``webhook.kube.webhookconfig``.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from webhook.core.errors import InputError
from webhook.tls import pki

DEFAULT_SERVICE: Final = "resize-preemption-webhook"
DEFAULT_NAMESPACE: Final = "resize-preemption-system"
DEFAULT_SECRET: Final = "resize-preemption-webhook-tls"
DEFAULT_DAYS: Final = 365
MAX_DAYS: Final = 3650
CLUSTER_DOMAIN: Final = "cluster.local"

CA_FILE: Final = "ca.crt"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
#: The kustomize patch ``deploy/overlays/self-signed`` reads from its ``tls/`` directory.
PATCH_FILE: Final = "ca-bundle.yaml"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class CertsError(InputError):
    """An argument of the certs command that cannot be used, or output that cannot be
    written."""


@dataclass(frozen=True, slots=True)
class WebhookCerts:
    """A CA certificate and the serving certificate and key it signed (PEM)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]

    @property
    def ca_bundle(self) -> str:
        """``clientConfig.caBundle``: the CA certificate PEM, base64-encoded."""
        return base64.b64encode(self.ca_pem).decode("ascii")


def service_dns_names(
    service: str, namespace: str, *, cluster_domain: str = CLUSTER_DOMAIN
) -> tuple[str, ...]:
    """Every name of ``service`` in ``namespace`` a client inside the cluster may use.

    The API server calls ``<svc>.<ns>.svc``; the others cover resolvers and tools that
    use the short or fully qualified forms.
    """
    check_dns_label(service, "service", dns1035=True)
    check_dns_label(namespace, "namespace")
    domain = check_dns_name(cluster_domain, "cluster domain")
    if domain.startswith("*"):
        raise CertsError(f"cluster domain {cluster_domain!r} is not a valid DNS name")
    base = f"{service}.{namespace}"
    return (service, base, f"{base}.svc", f"{base}.svc.{domain}")


def check_dns_label(value: str, what: str, *, dns1035: bool = False) -> str:
    """``value`` if it is an RFC 1123 label (RFC 1035 when ``dns1035``: a Service name)."""
    pattern = _DNS1035_LABEL if dns1035 else _DNS_LABEL
    if not pattern.match(value):
        kind = "an RFC 1035" if dns1035 else "an RFC 1123"
        raise CertsError(f"{what} {value!r} is not {kind} DNS label")
    return value


def check_dns_name(value: str, what: str = "--dns") -> str:
    """``value`` (lower-cased) if it is a DNS subdomain, optionally ``*.``-prefixed."""
    name = value.lower().rstrip(".")
    labels = name.split(".")
    if labels and labels[0] == "*":
        labels = labels[1:]
    if not labels or len(name) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        raise CertsError(f"{what} {value!r} is not a valid DNS name")
    return name


def check_ip(value: str) -> str:
    """``value`` in canonical form if it is an IPv4 or IPv6 address."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise CertsError(f"--ip {value!r} is not an IP address") from None


def check_days(value: int) -> int:
    if not 1 <= value <= MAX_DAYS:
        raise CertsError(f"--days must be between 1 and {MAX_DAYS}, not {value}")
    return value


def make_webhook_certs(
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    cluster_domain: str = CLUSTER_DOMAIN,
) -> WebhookCerts:
    """A fresh CA and a serving certificate for the webhook's Service (and the extras).

    Both are valid for ``days``; the serving certificate's common name is
    ``<svc>.<ns>.svc``, the name the API server dials.
    """
    validity = dt.timedelta(days=check_days(days))
    names = _unique(
        [*service_dns_names(service, namespace, cluster_domain=cluster_domain)]
        + [check_dns_name(n) for n in dns_names]
    )
    ips = _unique([check_ip(a) for a in ip_addresses])
    ca = pki.make_ca(f"{service}.{namespace} webhook CA", validity=validity)
    serving = pki.make_serving_cert(
        ca,
        dns_names=names,
        ip_addresses=ips,
        common_name=f"{service}.{namespace}.svc",
        validity=validity,
    )
    return WebhookCerts(
        ca_pem=ca.cert_pem,
        cert_pem=serving.cert_pem,
        key_pem=serving.key_pem,
        dns_names=names,
        ip_addresses=ips,
    )


def write_certs(certs: WebhookCerts, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``ca.crt``, ``tls.crt`` (0644) and ``tls.key`` (0600) into ``out_dir``.

    The directory is created (0700) if missing. Each file is replaced atomically, so a
    server watching them never reads half a key.
    """
    directory = _ensure_dir(out_dir)
    written = {
        CA_FILE: _write_atomic(directory / CA_FILE, certs.ca_pem, 0o644),
        CERT_FILE: _write_atomic(directory / CERT_FILE, certs.cert_pem, 0o644),
        KEY_FILE: _write_atomic(directory / KEY_FILE, certs.key_pem, 0o600),
    }
    return written


def write_ca_bundle_patch(certs: WebhookCerts, out_dir: str | os.PathLike[str]) -> Path:
    """Write the kustomize patch setting the caBundle (``ca-bundle.yaml``) into ``out_dir``."""
    directory = _ensure_dir(out_dir)
    return _write_atomic(
        directory / PATCH_FILE, ca_bundle_patch(certs.ca_bundle).encode("utf-8"), 0o644
    )


def ca_bundle_patch(ca_bundle: str) -> str:
    """A JSON 6902 patch (as YAML) setting ``caBundle`` on a webhook configuration.

    Written for ``deploy/overlays/self-signed``, whose kustomization applies it to the
    validating and the (optional) mutating configuration, each of which has one webhook.
    """
    header = (
        "# Written by `python -m webhook certs --kustomize-patch`; re-run it to rotate.\n"
        "# The caBundle of the webhook configurations: the CA that signed tls.crt.\n"
    )
    body = [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca_bundle}]
    return header + yaml.safe_dump(body, sort_keys=False, width=1 << 20)


def secret_manifest(
    certs: WebhookCerts,
    *,
    name: str = DEFAULT_SECRET,
    namespace: str = DEFAULT_NAMESPACE,
) -> str:
    """A ``kubernetes.io/tls`` Secret with ``tls.crt``, ``tls.key`` and ``ca.crt`` (YAML)."""
    check_dns_label(namespace, "namespace")
    _check_object_name(name, "secret name")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": DEFAULT_SERVICE},
        },
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(certs.cert_pem).decode("ascii"),
            "tls.key": base64.b64encode(certs.key_pem).decode("ascii"),
            "ca.crt": certs.ca_bundle,
        },
    }
    return yaml.safe_dump(secret, sort_keys=False, width=1 << 20)


def _check_object_name(value: str, what: str) -> str:
    if len(value) > 253 or not all(_DNS_LABEL.match(part) for part in value.split(".")):
        raise CertsError(f"{what} {value!r} is not a valid Kubernetes object name")
    return value


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _ensure_dir(out_dir: str | os.PathLike[str]) -> Path:
    directory = Path(out_dir)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise CertsError(f"--out {directory} exists and is not a directory") from None
    except OSError as e:
        raise CertsError(f"cannot create --out {directory}: {e.strerror or e}") from None
    if not directory.is_dir():
        raise CertsError(f"--out {directory} exists and is not a directory")
    return directory


def _write_atomic(path: Path, data: bytes, mode: int) -> Path:
    """Write ``data`` to a temporary file beside ``path`` with ``mode``, then rename it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:
        raise CertsError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise CertsError(f"cannot write {path}: {e.strerror or e}") from None
    return path


__all__ = [
    "CA_FILE",
    "CERT_FILE",
    "DEFAULT_DAYS",
    "DEFAULT_NAMESPACE",
    "DEFAULT_SECRET",
    "DEFAULT_SERVICE",
    "KEY_FILE",
    "PATCH_FILE",
    "CertsError",
    "WebhookCerts",
    "ca_bundle_patch",
    "check_dns_label",
    "check_dns_name",
    "check_ip",
    "make_webhook_certs",
    "secret_manifest",
    "service_dns_names",
    "write_ca_bundle_patch",
    "write_certs",
]
