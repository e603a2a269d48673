"""Bounded serving: the metrics port's connection cap, timeouts, address and TLS; the review
port's connections times body sizes within the memory limit."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.unit.web_fixtures import client_context, make_tls_files
from webhook.tls.serving import CertificateReloader
from webhook.web.server import (
    BODY_COPIES,
    WORKER_BASELINE_BYTES,
    ServerOptions,
    connections_within,
    memory_needed,
)
from webhook.web.shared_metrics import start_metrics_server

MiB = 1024 * 1024
GiB = 1024 * MiB


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("rpw_test_total", "a test counter", registry=registry).inc()
    return registry


def _scrape(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5, context=context) as response:
        return str(response.read().decode())


def test_the_metrics_port_closes_connections_past_its_cap_and_idle_ones_in_time() -> None:
    server = start_metrics_server(
        _registry(), host="127.0.0.1", port=0, max_connections=2, timeout=0.5
    )
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as third:
            third.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert b"" == third.recv(100)  # closed unanswered: the port is full
        time.sleep(1.0)  # the idle ones time out, and free their places
        assert "rpw_test_total 1.0" in _scrape(f"http://127.0.0.1:{server.port}")
        for s in idle:
            s.close()
    finally:
        server.stop()


def test_the_metrics_port_binds_the_address_it_is_given_and_serves_tls(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    tls = CertificateReloader(str(files.cert_file), str(files.key_file))
    server = start_metrics_server(
        _registry(), host="127.0.0.1", port=0, tls=lambda: tls.context(probes=True)
    )
    try:
        assert "127.0.0.1" == server.host
        url = f"https://127.0.0.1:{server.port}"
        assert "rpw_test_total 1.0" in _scrape(url, client_context(files.ca_file))
        with pytest.raises(OSError):
            _scrape(f"http://127.0.0.1:{server.port}")  # plain HTTP gets no answer
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("workers", "connections", "body", "limit", "fits"),
    [
        (2, 53, 3 * MiB, GiB, True),
        (2, 54, 3 * MiB, GiB, False),
        (1, 1000, 3 * MiB, GiB, False),
        (1, 1000, 3 * MiB, 8 * GiB, True),
        (2, 1000, 64 * 1024, GiB, True),
    ],
    ids=["chart-fits", "chart-one-more", "defaults-in-1Gi", "defaults-in-8Gi", "small-bodies"],
)
def test_connections_times_bodies_fit_the_memory_limit_or_the_server_refuses_to_start(
    workers: int, connections: int, body: int, limit: int, fits: bool
) -> None:
    options = ServerOptions(
        cert_file="c",
        key_file="k",
        workers=workers,
        worker_connections=connections,
        max_body_bytes=body,
        memory_limit=limit,
    )
    assert fits == (memory_needed(workers, connections, body) <= limit)
    assert fits == (connections <= connections_within(limit, workers, body))
    if fits:
        options.validate()
    else:
        with pytest.raises(ValueError, match="more than the memory limit"):
            options.validate()


def test_the_rule_counts_each_workers_baseline_and_every_body_held_twice() -> None:
    assert 2 * (WORKER_BASELINE_BYTES + 10 * BODY_COPIES * MiB) == memory_needed(2, 10, MiB)
