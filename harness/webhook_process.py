"""Runs the webhook service next to the local control plane and registers it.

The service's command-line contract::

    python -m webhook serve --kubeconfig FILE --tls-cert FILE --tls-key FILE \
        --port N --metrics-port M --service-namespace rpw-system

serving HTTPS ``/validate-resize`` and ``/readyz``. :func:`start_webhook` makes a CA and a
serving certificate for 127.0.0.1, starts that process, waits for ``/readyz`` (verifying the
certificate against the CA, as kube-apiserver will) and registers a
ValidatingWebhookConfiguration for ``pods/resize`` whose caBundle is that CA.

The service is given ``--client-ca``: the CA of the client certificate the control plane's
kube-apiserver presents to webhooks (:func:`harness.launcher.webhook_client_files`, found
next to the kubeconfig), so it answers kube-apiserver only. The harness's own requests to
it (readiness, benchmarks) present that certificate too: :func:`client_context`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import ssl
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.binaries import REPO_ROOT
from harness.kubeapi import ApiError, KubeClient
from harness.launcher import WebhookClientFiles, free_port, webhook_client_files
from harness.processes import ManagedProcess, spawn
from webhook.tls import pki

CONFIGURATION_NAME = "resize-preemption-webhook"
# Webhook names must be fully qualified (three or more DNS labels); the API server prefixes
# the webhook's audit annotations with it.
WEBHOOK_NAME = "validate-resize.resize-preemption.io"
NAMESPACE = "rpw-system"
CONFIGURATION_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
#: The service's own entry point (``harness.fault_hooks.COMMAND`` wraps it).
SERVE_COMMAND = (sys.executable, "-m", "webhook", "serve")


class WebhookUnavailable(RuntimeError):
    """The service did not start or did not become ready; the message says why."""


@dataclass
class WebhookProcess:
    """A running, registered webhook service."""

    process: ManagedProcess
    port: int
    metrics_port: int
    ca_pem: bytes
    client: KubeClient
    #: What authenticates the control plane's kube-apiserver to it; None: nothing does.
    client_files: WebhookClientFiles | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def context(self) -> ssl.SSLContext:
        """A client context that trusts the service and presents kube-apiserver's
        client certificate (:func:`client_context`)."""
        return client_context(self.ca_pem, self.client_files)

    def stop(self) -> None:
        """Unregister (so the API server stops calling it), then stop the process."""
        unregister(self.client)
        self.process.stop()


def webhook_configuration(port: int, ca_pem: bytes, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration for a service on 127.0.0.1:``port``.

    ``failurePolicy: Ignore``: when the service is down, resizes behave as without it.
    ``sideEffects: NoneOnDryRun``: the service evicts, but never for dry-run requests.
    The service's own namespace is excluded so it can never block itself.
    """
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate-resize",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["pods/resize"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": 5,
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": [namespace],
                        }
                    ]
                },
            }
        ],
    }


def register(client: KubeClient, configuration: dict[str, Any]) -> None:
    """Create or replace the ValidatingWebhookConfiguration."""
    name = configuration["metadata"]["name"]
    try:
        client.create(CONFIGURATION_PATH, configuration)
    except ApiError as e:
        if e.status != 409:
            raise
        current = client.get(f"{CONFIGURATION_PATH}/{name}")
        configuration = {
            **configuration,
            "metadata": {
                **configuration["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        client.replace(f"{CONFIGURATION_PATH}/{name}", configuration)


def unregister(client: KubeClient, name: str = CONFIGURATION_NAME) -> None:
    """Delete the ValidatingWebhookConfiguration if it exists."""
    with contextlib.suppress(ApiError, OSError):
        client.delete(f"{CONFIGURATION_PATH}/{name}")


def write_serving_files(cert_dir: Path) -> bytes:
    """A fresh CA and a serving certificate for 127.0.0.1 in ``cert_dir``; returns the CA."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca = pki.make_ca("rpw-webhook-ca")
    serving = pki.make_serving_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    for name, data in (
        ("ca.crt", ca.cert_pem),
        ("tls.crt", serving.cert_pem),
        ("tls.key", serving.key_pem),
    ):
        (cert_dir / name).write_bytes(data)
        (cert_dir / name).chmod(0o600)
    return ca.cert_pem


def client_auth_files(kubeconfig: Path) -> WebhookClientFiles | None:
    """The control plane's webhook client files, for the control plane whose state
    directory holds ``kubeconfig``; None when it has none (a cluster not started by
    :mod:`harness.launcher`)."""
    files = webhook_client_files(kubeconfig.parent)
    return files if files.ca.is_file() and files.cert.is_file() else None


def client_context(ca_pem: bytes, files: WebhookClientFiles | None) -> ssl.SSLContext:
    """Trusts the service's CA and, given ``files``, presents kube-apiserver's client
    certificate, as kube-apiserver does when it calls the service."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    if files is not None:
        context.load_cert_chain(str(files.cert), str(files.key))
    return context


def launch(
    kubeconfig: Path,
    cert_dir: Path,
    log_path: Path,
    *,
    port: int,
    metrics_port: int,
    ca_pem: bytes,
    namespace: str = NAMESPACE,
    command: Sequence[str] = SERVE_COMMAND,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
    name: str = "webhook",
    client_auth: bool = True,
) -> ManagedProcess:
    """Start one service process with the certificates of ``cert_dir`` and wait for
    ``/readyz``; raises WebhookUnavailable. Registers nothing. ``client_auth``: given
    ``--client-ca`` when the control plane has one (False: any caller is accepted)."""
    flags = {
        "--kubeconfig": str(kubeconfig),
        "--tls-cert": str(cert_dir / "tls.crt"),
        "--tls-key": str(cert_dir / "tls.key"),
        "--port": str(port),
        "--metrics-port": str(metrics_port),
        "--service-namespace": namespace,
    }
    client_files = client_auth_files(kubeconfig) if client_auth else None
    if client_files is not None:
        flags["--client-ca"] = str(client_files.ca)
    argv = [*command, *(part for item in flags.items() for part in item), *extra_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = spawn(name, argv, log_path, env=env, cwd=REPO_ROOT)
    try:
        shown = shlex.join([Path(command[0]).name, *command[1:]])
        _wait_ready(process, shown, port, client_context(ca_pem, client_files), ready_timeout)
    except BaseException:
        process.stop()
        raise
    return process


def start_webhook(
    client: KubeClient,
    kubeconfig: Path,
    state_dir: Path,
    *,
    port: int | None = None,
    metrics_port: int | None = None,
    namespace: str = NAMESPACE,
    command: Sequence[str] = SERVE_COMMAND,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
    settle: float = 0.5,
    client_auth: bool = True,
) -> WebhookProcess:
    """Start the service, wait for ``/readyz``, register it; raises WebhookUnavailable.

    ``command`` is what runs before the contract's flags (tests pass a stand-in server).
    ``settle``: seconds to let kube-apiserver's webhook informer load the new configuration
    before returning, so the very next resize goes through the webhook. ``client_auth``:
    see :func:`launch`.
    """
    port = port or free_port()
    metrics_port = metrics_port or free_port()
    cert_dir = state_dir / "webhook"
    ca_pem = write_serving_files(cert_dir)
    ensure_namespace(client, namespace)
    process = launch(
        kubeconfig,
        cert_dir,
        state_dir / "logs" / "webhook.log",
        port=port,
        metrics_port=metrics_port,
        ca_pem=ca_pem,
        namespace=namespace,
        command=command,
        extra_args=extra_args,
        ready_timeout=ready_timeout,
        client_auth=client_auth,
    )
    try:
        register(client, webhook_configuration(port, ca_pem, namespace))
    except BaseException:
        process.stop()
        raise
    time.sleep(settle)
    files = client_auth_files(kubeconfig) if client_auth else None
    return WebhookProcess(process, port, metrics_port, ca_pem, client, files)


def ensure_namespace(client: KubeClient, name: str) -> None:
    try:
        client.create("/api/v1/namespaces", {"metadata": {"name": name}})
    except ApiError as e:
        if e.status != 409:
            raise


def _wait_ready(
    process: ManagedProcess, shown: str, port: int, context: ssl.SSLContext, timeout: float
) -> None:
    url = f"https://127.0.0.1:{port}/readyz"
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        if not process.running():
            tail = process.log_tail(15)
            last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
            raise WebhookUnavailable(
                f"`{shown}` exited with {process.popen.returncode}: {last}\n{tail}"
            )
        try:
            with urllib.request.urlopen(url, context=context, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError as e:  # not listening yet, or answering 503 while warming up
            last_error = str(e)
        time.sleep(0.1)
    raise WebhookUnavailable(
        f"webhook not ready at {url} after {timeout:.0f} s ({last_error}):\n{process.log_tail(15)}"
    )
