"""A webhook server process on loopback as the benchmarks drive it: a free port, waiting
until it answers ``/readyz``, reading one answer off a kept-alive TLS socket, and its
gunicorn workers' pids, CPU time and RSS from ``/proc``."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import subprocess
import time

from harness.hostile_clients import client_context


def read_response(sock: ssl.SSLSocket, data: bytes) -> tuple[int, bytes, bytes]:
    """(status, body, bytes read past it) of one HTTP/1.1 response with a Content-Length
    (every answer of the server has one)."""
    while (end := data.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed before the response headers")
        data += chunk
    head = data[:end].decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = next(
        (
            int(v)
            for k, _, v in (h.partition(":") for h in lines[1:])
            if k.lower() == "content-length"
        ),
        None,
    )
    if length is None:
        raise ValueError(f"response without Content-Length: {head!r}")
    start = end + 4
    while len(data) < start + length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed inside the response body")
        data += chunk
    return status, data[start : start + length], data[start + length :]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, ca: str, server: subprocess.Popen[bytes], timeout: float = 60) -> None:
    context = client_context(ca)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"server exited with {server.returncode}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("server did not become ready")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_pids(master: int) -> list[int]:
    """The gunicorn workers: the master's children."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == master:
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
