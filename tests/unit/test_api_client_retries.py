"""A request the API server took and never answered is not sent again by the client."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from webhook.kube.client import make_api_client
from webhook.kube.errors import ClusterError
from webhook.kube.jsonapi import request_json


class SilentServer:
    """Accepts connections, reads what is sent, never answers; counts the requests."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self._held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            data += chunk
        self.requests += 1

    def close(self) -> None:
        self.listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def server() -> Iterator[SilentServer]:
    s = SilentServer()
    yield s
    s.close()


def kubeconfig(tmp_path: Path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


@pytest.mark.parametrize("method", ["PUT", "POST", "GET"])
def test_a_request_that_timed_out_is_sent_once(
    server: SilentServer, tmp_path: Path, method: str
) -> None:
    api = make_api_client(kubeconfig(tmp_path, server.port))
    body = {"metadata": {"name": "x"}} if method != "GET" else None
    began = time.monotonic()

    with pytest.raises(ClusterError):
        request_json(
            api,
            method,
            "/apis/coordination.k8s.io/v1/namespaces/n/leases/x",
            body=body,
            timeout=(1.0, 0.5),
        )

    elapsed = time.monotonic() - began
    time.sleep(0.2)  # a resend, had there been one, would have arrived by now
    api.close()
    assert 1 == server.requests
    assert elapsed < 1.5, elapsed
