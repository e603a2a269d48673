"""Objects and reviews the web-layer tests share: the walkthrough cluster, review bodies,
TLS material, and the real server in a child process.

The walkthrough: node-1 has 8 CPU; low-priority-pod (priority 1000) holds 3 CPU;
high-priority-pod (priority 1000000) holds 4 CPU and is resized to 6. 4 + 3 + 6 > 8, so
low-priority-pod must go.

Run as ``python -m tests.unit.web_fixtures --cert C --key K --port P`` it serves the
walkthrough cluster with the real gunicorn server (used by the TLS tests).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from harness import pki as harness_pki
from harness.doubles import StaticClusterView
from webhook.core.model import FIT_TO_NODE_ANNOTATION
from webhook.tls import pki

NODE = "node-1"
START = "2025-01-01T00:00:00Z"


def node(name: str = NODE, cpu: str = "8", memory: str = "32Gi") -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


def pod(
    name: str,
    cpu: str,
    priority: int,
    *,
    namespace: str = "default",
    memory: str = "1Gi",
    node_name: str = NODE,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A running Guaranteed pod with one container ``app`` (requests == limits)."""
    amounts = {"cpu": cpu, "memory": memory}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node_name,
            "priority": priority,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": dict(amounts), "limits": dict(amounts)},
                }
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "startTime": START,
            "containerStatuses": [
                {
                    "name": "app",
                    "allocatedResources": dict(amounts),
                    "resources": {"requests": dict(amounts), "limits": dict(amounts)},
                }
            ],
        },
    }


def resized(obj: Mapping[str, Any], cpu: str, *, limits: bool = True) -> dict[str, Any]:
    """``obj`` with container ``app`` asking for ``cpu`` (status untouched, as the API
    server sends it in a pods/resize review)."""
    new = copy.deepcopy(dict(obj))
    resources = new["spec"]["containers"][0]["resources"]
    resources["requests"]["cpu"] = cpu
    if limits:
        resources["limits"]["cpu"] = cpu
    return new


def walkthrough_objects() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(node-1, low-priority-pod, high-priority-pod)."""
    return (
        node(),
        pod("low-priority-pod", "3", 1000),
        pod("high-priority-pod", "4", 1_000_000),
    )


def walkthrough_view(*, synced: bool = True) -> StaticClusterView:
    return StaticClusterView.from_objects(walkthrough_objects(), synced=synced)


def review(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    *,
    uid: str = "review-1",
    sub_resource: str | None = "resize",
    operation: str = "UPDATE",
    dry_run: bool = False,
    api_version: str = "admission.k8s.io/v1",
) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for ``kubectl patch --subresource``."""
    subject = new or old or {}
    meta = subject.get("metadata", {})
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": new,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if sub_resource is not None:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def walkthrough_review(**kwargs: Any) -> dict[str, Any]:
    """high-priority-pod 4 -> 6 CPU."""
    _, _, high = walkthrough_objects()
    return review(high, resized(high, "6"), **kwargs)


def fit_to_node_objects(
    annotated: bool = True,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """node-1 (8 CPU); system-pod (2 CPU, priority above the resizer, so never a victim);
    low-priority-pod (3 CPU); high-priority-pod (3 CPU, optionally fit-to-node)."""
    annotations = {FIT_TO_NODE_ANNOTATION: "true"} if annotated else None
    return (
        node(),
        pod("system-pod", "2", 2_000_000_000, namespace="kube-system"),
        pod("low-priority-pod", "3", 1000),
        pod("high-priority-pod", "3", 1_000_000, annotations=annotations),
    )


# -- TLS and the server in a child process -------------------------------------------------


@dataclass(frozen=True, slots=True)
class TLSFiles:
    ca: pki.CertificateAuthority
    ca_file: Path
    cert_file: Path
    key_file: Path

    def rotate(self, *, matching: bool = True) -> int:
        """Write a new serving pair over the files (as a Secret update would); returns
        the new certificate's serial. ``matching=False`` writes a key of another pair."""
        pair = pki.make_serving_cert(self.ca, ip_addresses=["127.0.0.1"], dns_names=["localhost"])
        key = pair.key_pem if matching else harness_pki.generate_private_key_pem()
        replace_file(self.cert_file, pair.cert_pem)
        replace_file(self.key_file, key)
        return serial_of(pair.cert_pem)


def replace_file(path: Path, data: bytes) -> None:
    """Atomic replace (a new inode), like cert-manager's and the kubelet's writers."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def serial_of(cert_pem: bytes) -> int:
    from cryptography import x509

    return int(x509.load_pem_x509_certificate(cert_pem).serial_number)


def make_tls_files(directory: Path) -> TLSFiles:
    ca = pki.make_ca("resize-preemption-webhook test CA")
    pair = pki.make_serving_cert(ca, ip_addresses=["127.0.0.1"], dns_names=["localhost"])
    files = TLSFiles(ca, directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    files.ca_file.write_bytes(ca.cert_pem)
    files.cert_file.write_bytes(pair.cert_pem)
    files.key_file.write_bytes(pair.key_pem)
    return files


def client_context(ca_file: Path) -> ssl.SSLContext:
    """What the API server does: verify against the caBundle, connect by IP (no SNI)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    return context


def peer_serial(port: int, ca_file: Path, *, timeout: float = 5.0) -> int:
    """Serial of the certificate a NEW connection to 127.0.0.1:``port`` is shown."""
    context = client_context(ca_file)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw,
        # server_hostname is an IP: Python sends no SNI for IP addresses, like Go.
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    from cryptography import x509

    return int(x509.load_der_x509_certificate(der).serial_number)


def wait_for_tls(port: int, ca_file: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            peer_serial(port, ca_file, timeout=1.0)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _serve_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--check-interval", type=float, default=0.0)
    parser.add_argument("--client-ca", default=None)
    parser.add_argument("--probe-port", type=int, default=None)
    for deadline in ("handshake", "header", "body"):
        parser.add_argument(f"--{deadline}-timeout", type=float, default=10.0)
    parser.add_argument(
        "--lifecycle-dir", help="record which process built the app and ran the services"
    )
    args = parser.parse_args()
    lifecycle = Path(args.lifecycle_dir) if args.lifecycle_dir else None

    def record(event: str) -> None:
        if lifecycle is not None:
            (lifecycle / event).write_text(str(os.getpid()))

    from harness.doubles import InMemoryLedger
    from webhook.base.metrics import Metrics
    from webhook.base.settings import Config
    from webhook.tls.serving import CertificateReloader
    from webhook.web.app import create_app
    from webhook.web.server import ServerOptions, WorkerApp, serve

    def start_services() -> Callable[[], None]:
        record("started")
        return lambda: record("stopped")

    def factory(tls: CertificateReloader) -> WorkerApp:
        record(f"built-{os.getpid()}" if args.workers > 1 else "built")
        view, ledger, metrics = walkthrough_view(), InMemoryLedger(), Metrics()
        app = create_app(
            Config(),
            cluster=view,
            ledger=ledger,
            metrics=metrics,
            readiness=lambda: {
                "tls": tls.loaded(),
                "cache": view.synced(),
                "ledger": ledger.reachable(),
            },
        )
        return WorkerApp(app, start=start_services, registry=metrics.registry)

    record("master")
    options = ServerOptions(
        cert_file=args.cert,
        key_file=args.key,
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        metrics_port=args.metrics_port,
        metrics_host="127.0.0.1",
        tls_check_interval=args.check_interval,
        log_level="warning",
        handshake_timeout=args.handshake_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        client_ca=args.client_ca,
        probe_port=args.probe_port,
    )
    serve(factory, options)


def review_latency(port: int, ca_file: Path, *, uid: str, timeout: float = 5.0) -> float:
    """Seconds for one review on a new connection (handshake included), as the API
    server sends it; ``inf`` when it is not answered 200 within ``timeout``."""
    body = dumps(walkthrough_review(uid=uid))
    request = (
        "POST /validate-resize HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    t0 = time.monotonic()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw,
            client_context(ca_file).wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            conn.settimeout(max(0.01, timeout - (time.monotonic() - t0)))
            conn.sendall(request)
            data = b""
            while uid.encode() not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return math.inf
                data += chunk
    except OSError:
        return math.inf
    if not data.startswith(b"HTTP/1.1 200"):
        return math.inf
    return time.monotonic() - t0


def p99(samples: list[float]) -> float:
    """The 99th centile (nearest rank): with under 100 samples, the largest."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


if __name__ == "__main__":
    _serve_main()
