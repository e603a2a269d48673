"""The service's own certificates in the cluster (the chart's certificates mode ``service``).

Three parts, each over the Secret named in :class:`webhook.tls.rotation.ManagedTLS`:

* :func:`ensure` renews what :func:`webhook.tls.rotation.renewal` says is due and keeps the
  webhook configurations' ``caBundle`` equal to the Secret's ``ca.crt``. The ``caBundle``
  is set *before* the Secret is written: it then trusts the CA of the certificate served
  now and of the one about to be served. The Secret is written with the resourceVersion
  it was read at, so of replicas racing (all start at once on install) one wins and the
  others read its result.
* :class:`CertificateRotator` runs :func:`ensure` every period on the leader.
* :class:`CertificateFollower` runs on every replica and writes the Secret's current pair
  into the files the server serves (:class:`webhook.tls.serving.CertificateReloader` reloads
  them), within a period of a renewal; reading the Secret through the API rather than
  a Secret volume makes a new install serve at once, not after the kubelet's next sync.

With :attr:`ManagedTLS.client` (client certificates required, the chart's ``clientAuth``
in this mode), :func:`ensure_client` keeps kube-apiserver's client certificate and its CA
in a second Secret the same way, the rotator renews it, and the follower writes that
Secret's ``ca.crt`` into the ``client-ca`` file, which the reloader reloads with the pair.

``python -m webhook.kube.certs`` (options as JSON on stdin) runs :func:`ensure` and writes
the files once: ``serve --tls-secret`` runs it before the server starts, in a process of its
own so that the server's processes import the Kubernetes client only after gevent patched
them (:mod:`webhook.web.worker`).

Rights: ``get`` and ``update`` on the Secret (and the client Secret), ``get`` and
``patch`` on the webhook configurations, each by name (docs/deploy.md "RBAC rationale").
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from cryptography import x509

from webhook.kube.client import make_api_client
from webhook.kube.errors import ClusterError, Conflict
from webhook.kube.jsonapi import request_json
from webhook.kube.webhookconfig import set_ca_bundle
from webhook.tls.rotation import (
    CA_CERT,
    KEYS,
    TLS_CERT,
    TLS_KEY,
    ManagedTLS,
    RotationPolicy,
    renewal,
)

log = logging.getLogger(__name__)

_ATTEMPTS: Final = 3
#: Seconds the start-up run keeps trying while the API server or the Secret is not there yet.
BOOTSTRAP_TIMEOUT: Final = 120.0
_TIMEOUT: Final = 10.0


def _path(namespace: str, secret: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets/{secret}"


def read_secret(
    api_client: Any, namespace: str, name: str
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The Secret as read, and its data decoded (only the keys this module writes)."""
    secret = request_json(api_client, "GET", _path(namespace, name), timeout=_TIMEOUT)
    raw = secret.get("data") or {}
    data = {k: base64.b64decode(raw[k]) for k in KEYS if isinstance(raw.get(k), str)}
    return secret, data


def _renew(
    api_client: Any,
    where: tuple[str, str],
    policy: RotationPolicy,
    now: Callable[[], dt.datetime],
    before_write: Callable[[dict[str, bytes]], None],
) -> tuple[bool, dict[str, bytes]]:
    """Renew the Secret ``where`` (namespace, name) as :func:`renewal` says; whether it
    was written, and its data. ``before_write`` sees the data current from now on before
    anything is written (and when nothing is)."""
    for _ in range(_ATTEMPTS):
        secret, data = read_secret(api_client, *where)
        wanted = renewal(data, policy, now())
        before_write(wanted if wanted is not None else data)
        if wanted is None:
            return False, data
        encoded = {k: base64.b64encode(v).decode() for k, v in wanted.items()}
        body = {**secret, "data": {**(secret.get("data") or {}), **encoded}}
        try:
            request_json(api_client, "PUT", _path(*where), body=body, timeout=_TIMEOUT)
        except Conflict:
            continue
        return True, wanted
    raise ClusterError(f"Secret {where[0]}/{where[1]} kept changing while renewed")


def ensure(
    api_client: Any,
    tls: ManagedTLS,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
) -> tuple[bool, dict[str, bytes]]:
    """Make the Secret and the ``caBundle`` current; whether the Secret was written, and
    its data. Raises :class:`ClusterError` when the API refuses or keeps conflicting."""

    def ca_bundle(current: dict[str, bytes]) -> None:
        set_ca_bundle(
            api_client,
            base64.b64encode(current[CA_CERT]).decode(),
            names=tls.webhook_configs,
            changed_only=True,
        )

    written, data = _renew(api_client, (tls.namespace, tls.secret), tls.policy, now, ca_bundle)
    if written:
        log.info("certificate: renewed in Secret %s/%s", tls.namespace, tls.secret)
    return written, data


def ensure_client(
    api_client: Any,
    tls: ManagedTLS,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
) -> tuple[bool, dict[str, bytes]]:
    """Make kube-apiserver's client certificate and its CA current in their Secret
    (:attr:`ManagedTLS.client`); whether it was written, and its data."""
    client = tls.client
    if client is None:
        return False, {}
    where = (tls.namespace, client.secret)
    written, data = _renew(api_client, where, client.policy, now, lambda _: None)
    if written:
        expires = x509.load_pem_x509_certificate(data[TLS_CERT]).not_valid_after_utc
        # kube-apiserver reads the copy on its control-plane nodes, never the Secret.
        log.warning(
            "certificate: kube-apiserver's client certificate renewed in Secret %s/%s "
            "(valid until %s): copy its tls.crt and tls.key to the files the control "
            "plane's admission kubeconfig names before the one there expires",
            *where,
            expires.isoformat(),
        )
    return written, data


def _replace(path: str, content: bytes) -> bool:
    """Write ``content`` into ``path`` by renaming a new file over it, unless it holds
    that already; whether it wrote."""
    target = Path(path)
    if target.exists() and target.read_bytes() == content:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    os.replace(partial, target)
    return True


def write_files(data: dict[str, bytes], tls: ManagedTLS) -> bool:
    """Write the pair in ``data`` into the served files when it differs from theirs;
    whether it did. The key goes first: the reloader keeps the old pair until both match."""
    if TLS_CERT not in data or TLS_KEY not in data:
        return False
    key = _replace(tls.key_file, data[TLS_KEY])
    return _replace(tls.cert_file, data[TLS_CERT]) or key


def write_client_ca(data: dict[str, bytes], tls: ManagedTLS) -> bool:
    """Write the client Secret's ``ca.crt`` (``data``) into the file of the CA trusted for
    reviews when it differs; whether it did. The reloader reloads it with the pair."""
    if tls.client is None or CA_CERT not in data:
        return False
    return _replace(tls.client.ca_file, data[CA_CERT])


class _Every:
    """``step`` on a daemon thread every ``period`` seconds until stopped; a failed step is
    logged and tried again next period."""

    def __init__(self, name: str, period: float, step: Callable[[], None]) -> None:
        self._name = name
        self._period = period
        self._step = step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except ClusterError as e:
                log.warning("%s: %s", self._name, e)
            except Exception:
                log.exception("%s failed", self._name)
            self._stop.wait(self._period)


def _period(tls: ManagedTLS) -> float:
    """Often enough for the serving certificate and, when kept, the client's."""
    client = tls.client
    return tls.policy.period if client is None else min(tls.policy.period, client.policy.period)


class CertificateRotator(_Every):
    """The leader's: renews the certificates when due, keeps the ``caBundle`` current."""

    def __init__(self, api_client: Any, tls: ManagedTLS) -> None:
        def rotate() -> None:
            ensure(api_client, tls)
            ensure_client(api_client, tls)

        super().__init__("certificate-rotator", _period(tls), rotate)


class CertificateFollower(_Every):
    """Every replica's: serves the Secret's current pair and trusts the client Secret's
    current CA."""

    def __init__(self, api_client: Any, tls: ManagedTLS) -> None:
        def follow() -> None:
            if write_files(read_secret(api_client, tls.namespace, tls.secret)[1], tls):
                log.info("certificate: serving the Secret's new pair")
            if tls.client is None:
                return
            client = read_secret(api_client, tls.namespace, tls.client.secret)[1]
            if write_client_ca(client, tls):
                log.info("certificate: trusting the client Secret's new CA")

        super().__init__("certificate-follower", _period(tls), follow)


def bootstrap(tls: ManagedTLS, kubeconfig: str | None, timeout: float = BOOTSTRAP_TIMEOUT) -> None:
    """:func:`ensure`, then the files: what must hold before the server starts. Retries
    while the API server is unreachable or refuses, for up to ``timeout`` seconds."""
    api_client = make_api_client(kubeconfig)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                _, data = ensure(api_client, tls)
                _, client = ensure_client(api_client, tls)
                write_files(data, tls)
                write_client_ca(client, tls)
                return
            except ClusterError as e:
                if time.monotonic() >= deadline:
                    raise
                log.warning("certificate: %s; trying again", e)
                time.sleep(2.0)
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raw = json.loads(sys.stdin.read())
    tls = ManagedTLS.from_json(raw["tls"])
    try:
        bootstrap(tls, raw.get("kubeconfig"), float(raw.get("timeout", BOOTSTRAP_TIMEOUT)))
    except ClusterError as e:
        names = [tls.secret] if tls.client is None else [tls.secret, tls.client.secret]
        where = ", ".join(f"{tls.namespace}/{n}" for n in names)
        # The API server's message names the Secret it refused.
        print(f"error: the certificates in Secret {where}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "CertificateFollower",
    "CertificateRotator",
    "bootstrap",
    "ensure",
    "ensure_client",
    "read_secret",
    "write_client_ca",
    "write_files",
]
