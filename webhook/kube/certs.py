"""The service's own certificates in the cluster (the chart's certificates mode ``service``).

Three parts, each over the Secret named in :class:`webhook.rotation.ManagedTLS`:

* :func:`ensure` renews what :func:`webhook.rotation.renewal` says is due and keeps the
  webhook configurations' ``caBundle`` equal to the Secret's ``ca.crt``. The ``caBundle``
  is set *before* the Secret is written: it then trusts the CA of the certificate served
  now and of the one about to be served. The Secret is written with the resourceVersion
  it was read at, so of replicas racing (all start at once on install) one wins and the
  others read its result.
* :class:`CertificateRotator` runs :func:`ensure` every period on the leader.
* :class:`CertificateFollower` runs on every replica and writes the Secret's current pair
  into the files the server serves (:class:`webhook.web.tls.CertificateReloader` reloads
  them), within a period of a renewal; reading the Secret through the API rather than
  a Secret volume makes a new install serve at once, not after the kubelet's next sync.

``python -m webhook.kube.certs`` (options as JSON on stdin) runs :func:`ensure` and writes
the files once: ``serve --tls-secret`` runs it before the server starts, in a process of its
own so that the server's processes import the Kubernetes client only after gevent patched
them (:mod:`webhook.web.worker`).

Rights: ``get`` and ``update`` on the one Secret, ``get`` and ``patch`` on the webhook
configurations, each by name (docs/deploy.md "RBAC rationale").
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

from webhook.kube.client import make_api_client
from webhook.kube.errors import ClusterError, Conflict
from webhook.kube.jsonapi import request_json
from webhook.kube.webhookconfig import set_ca_bundle
from webhook.rotation import CA_CERT, KEYS, TLS_CERT, TLS_KEY, ManagedTLS, renewal

log = logging.getLogger(__name__)

_ATTEMPTS: Final = 3
#: Seconds the start-up run keeps trying while the API server or the Secret is not there yet.
BOOTSTRAP_TIMEOUT: Final = 120.0
_TIMEOUT: Final = 10.0


def _path(tls: ManagedTLS) -> str:
    return f"/api/v1/namespaces/{tls.namespace}/secrets/{tls.secret}"


def read_secret(api_client: Any, tls: ManagedTLS) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The Secret as read, and its data decoded (only the keys this module writes)."""
    secret = request_json(api_client, "GET", _path(tls), timeout=_TIMEOUT)
    raw = secret.get("data") or {}
    data = {k: base64.b64decode(raw[k]) for k in KEYS if isinstance(raw.get(k), str)}
    return secret, data


def ensure(
    api_client: Any,
    tls: ManagedTLS,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
) -> tuple[bool, dict[str, bytes]]:
    """Make the Secret and the ``caBundle`` current; whether the Secret was written, and
    its data. Raises :class:`ClusterError` when the API refuses or keeps conflicting."""
    for _ in range(_ATTEMPTS):
        secret, data = read_secret(api_client, tls)
        wanted = renewal(data, tls.policy, now())
        current = wanted if wanted is not None else data
        set_ca_bundle(
            api_client,
            base64.b64encode(current[CA_CERT]).decode(),
            names=tls.webhook_configs,
            changed_only=True,
        )
        if wanted is None:
            return False, data
        encoded = {k: base64.b64encode(v).decode() for k, v in wanted.items()}
        body = {**secret, "data": {**(secret.get("data") or {}), **encoded}}
        try:
            request_json(api_client, "PUT", _path(tls), body=body, timeout=_TIMEOUT)
        except Conflict:
            continue
        log.info("certificate: renewed in Secret %s/%s", tls.namespace, tls.secret)
        return True, wanted
    raise ClusterError(f"Secret {tls.namespace}/{tls.secret} kept changing while renewed")


def write_files(data: dict[str, bytes], tls: ManagedTLS) -> bool:
    """Write the pair in ``data`` into the served files when it differs from theirs;
    whether it did. The key goes first: the reloader keeps the old pair until both match."""
    if TLS_CERT not in data or TLS_KEY not in data:
        return False
    written = False
    for path, content in ((tls.key_file, data[TLS_KEY]), (tls.cert_file, data[TLS_CERT])):
        target = Path(path)
        if target.exists() and target.read_bytes() == content:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.replace(partial, target)
        written = True
    return written


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


class CertificateRotator(_Every):
    """The leader's: renews the certificates when due, keeps the ``caBundle`` current."""

    def __init__(self, api_client: Any, tls: ManagedTLS) -> None:
        def rotate() -> None:
            ensure(api_client, tls)

        super().__init__("certificate-rotator", tls.policy.period, rotate)


class CertificateFollower(_Every):
    """Every replica's: serves the Secret's current pair."""

    def __init__(self, api_client: Any, tls: ManagedTLS) -> None:
        def follow() -> None:
            if write_files(read_secret(api_client, tls)[1], tls):
                log.info("certificate: serving the Secret's new pair")

        super().__init__("certificate-follower", tls.policy.period, follow)


def bootstrap(tls: ManagedTLS, kubeconfig: str | None, timeout: float = BOOTSTRAP_TIMEOUT) -> None:
    """:func:`ensure`, then the files: what must hold before the server starts. Retries
    while the API server is unreachable or refuses, for up to ``timeout`` seconds."""
    api_client = make_api_client(kubeconfig)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                _, data = ensure(api_client, tls)
                write_files(data, tls)
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
        where = f"{tls.namespace}/{tls.secret}"
        print(f"error: the certificate in Secret {where}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "CertificateFollower",
    "CertificateRotator",
    "bootstrap",
    "ensure",
    "read_secret",
    "write_files",
]
