"""Memory under a flood of maximum-size bodies: does the review port stay within the
chart's memory limit?

The server is the chart's replica (``serve --workers 2``, :mod:`bench.review_bench`'s
server, client certificates required) given the chart's memory limit (1 GiB), so it
holds as many connections per worker as :func:`webhook.web.server.connections_within`
allows. Twice as many clients as all its workers hold then each open a connection on
loopback, present the API server's certificate, send the headers of a review of
``max-body-bytes`` and all of its body but the last byte, and wait: every connection the
server took holds a whole body in memory at once, the worst case. The resident memory of
the master and its workers, summed, is sampled every 100 ms meanwhile; the peak is
compared with the limit.

Bounded in time (``--seconds``, under the server's body deadline of 10 s) and count
(``--clients``, at most 1000). ``python -m bench body-flood``; results in
``bench/results/body-flood.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.binaries import REPO_ROOT as REPO
from harness.hostile_clients import CLIENT_CERT, CLIENT_KEY, client_context
from harness.local_server import free_port, wait_ready, worker_pids
from harness.provenance import Run

RESULTS = Path(__file__).resolve().parent / "results" / "body-flood.json"
#: The chart's resources.limits.memory and server.workers.
MEMORY_LIMIT = 1024 * 1024 * 1024
WORKERS = 2
MAX_CLIENTS = 1000
#: Seconds over which the clients connect.
RAMP = 3.0


def _rss(pid: int) -> int:
    """Resident bytes of ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _hold(
    port: int, context: ssl.SSLContext, body_bytes: int, until: float, out: list[str]
) -> None:
    """One client: a review's headers and all of its body but the last byte, then wait."""
    head = (
        "POST /validate-resize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {body_bytes}\r\n\r\n"
    ).encode()
    chunk = b" " * (256 * 1024)
    try:
        with (
            socket.create_connection(
                ("127.0.0.1", port), timeout=max(0.5, until - time.time())
            ) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(head)
            left = body_bytes - 1
            while left > 0 and time.time() < until:
                n = min(left, len(chunk))
                tls.sendall(chunk[:n])
                left -= n
            out.append("held" if left == 0 else "partial")
            time.sleep(max(0.0, until - time.time()))
    except OSError:
        out.append("refused")


def run(clients: int, seconds: float, memory_limit: int, body_bytes: int) -> dict[str, Any]:
    from harness.pki import make_client_cert
    from webhook.base.settings import DEFAULT_CLIENT_CN
    from webhook.tls import pki
    from webhook.web.server import connections_within, memory_needed

    per_worker = connections_within(memory_limit, WORKERS, body_bytes)
    with tempfile.TemporaryDirectory(prefix="body-flood-") as tmp:
        ca = pki.make_ca("body flood CA")
        pair = pki.make_serving_cert(ca, ip_addresses=["127.0.0.1"])
        client_ca = pki.make_ca("body flood client CA")
        client = make_client_cert(client_ca, DEFAULT_CLIENT_CN)
        files = {
            "ca.crt": ca.cert_pem,
            "tls.crt": pair.cert_pem,
            "tls.key": pair.key_pem,
            "client-ca.crt": client_ca.cert_pem,
            CLIENT_CERT: client.cert_pem,
            CLIENT_KEY: client.key_pem,
        }
        for name, data in files.items():
            Path(tmp, name).write_bytes(data)
        port = free_port()
        server = subprocess.Popen(
            [
                sys.executable, "-m", "bench.review_bench", "serve",
                "--cert", f"{tmp}/tls.crt", "--key", f"{tmp}/tls.key",
                "--port", str(port), "--workers", str(WORKERS),
                "--client-ca", f"{tmp}/client-ca.crt",
                "--worker-connections", str(per_worker),
                "--memory-limit", str(memory_limit),
            ],
            cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
        try:
            wait_ready(port, f"{tmp}/ca.crt", server)
            time.sleep(1.0)
            pids = [server.pid, *worker_pids(server.pid)]
            idle = sum(_rss(p) for p in pids)
            context = client_context(f"{tmp}/ca.crt")
            outcomes: list[str] = []
            until = time.time() + seconds
            threads = [
                threading.Thread(target=_hold, args=(port, context, body_bytes, until, outcomes))
                for _ in range(clients)
            ]
            # Spread over the first 3 s: all at once, most would be reset before their
            # handshake as an overload (webhook.web.worker) and never hold a body.
            for t in threads:
                t.start()
                time.sleep(RAMP / len(threads))
            peak = idle
            while time.time() < until:
                peak = max(peak, sum(_rss(p) for p in pids))
                time.sleep(0.1)
            for t in threads:
                t.join(timeout=30)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "memory_limit_bytes": memory_limit,
        "workers": WORKERS,
        "max_body_bytes": body_bytes,
        "worker_connections": per_worker,
        "rule_bytes": memory_needed(WORKERS, per_worker, body_bytes),
        "clients": clients,
        "seconds": seconds,
        "held_whole_bodies": outcomes.count("held"),
        "partial": outcomes.count("partial"),
        "refused": outcomes.count("refused"),
        "rss_idle_bytes": idle,
        "rss_peak_bytes": peak,
        "within_limit": peak <= memory_limit,
    }


def table(r: dict[str, Any]) -> str:
    mib = 1024 * 1024
    return "\n".join(
        [
            f"body flood: {r['workers']} workers x {r['worker_connections']} connections x "
            f"{r['max_body_bytes']}-byte bodies (rule: {r['rule_bytes'] / mib:.0f} MiB within "
            f"{r['memory_limit_bytes'] / mib:.0f} MiB)",
            f"  {r['clients']} clients for {r['seconds']:g} s: {r['held_whole_bodies']} sent "
            f"a whole body but its last byte, {r['partial']} only part of it, "
            f"{r['refused']} refused or cut",
            f"  RSS (master + workers): idle {r['rss_idle_bytes'] / mib:.0f} MiB, peak "
            f"{r['rss_peak_bytes'] / mib:.0f} MiB: "
            + ("within the limit" if r["within_limit"] else "OVER THE LIMIT"),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench body-flood", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer clients, shorter")
    parser.add_argument("--clients", type=int, default=0, help="default: twice what fits")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--memory-limit", type=int, default=MEMORY_LIMIT)
    parser.add_argument("--max-body-bytes", type=int, default=3 * 1024 * 1024)
    args = parser.parse_args(argv)
    started = Run()
    from webhook.web.server import connections_within

    fits = WORKERS * connections_within(args.memory_limit, WORKERS, args.max_body_bytes)
    clients = min(MAX_CLIENTS, args.clients or 2 * fits)
    seconds = min(args.seconds, 9.0)
    if args.quick:
        clients, seconds = min(clients, 20), min(seconds, 3.0)
    result = run(clients, seconds, args.memory_limit, args.max_body_bytes)
    print(table(result))
    if not args.quick:
        started.write(RESULTS, result)
    return 0 if result["within_limit"] else 1


if __name__ == "__main__":
    sys.exit(main())
