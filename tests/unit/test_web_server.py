"""The gunicorn wrapper and the metrics server: settings, process model, lifecycle."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from harness.doubles import InMemoryLedger, StaticClusterView
from harness.launcher import free_port
from harness.processes import ManagedProcess, spawn
from tests.unit.web_fixtures import (
    TLSFiles,
    client_context,
    dumps,
    make_tls_files,
    wait_for_tls,
    walkthrough_review,
)
from webhook.service import process_identity
from webhook.tls.serving import CertificateReloader
from webhook.web.app import create_app
from webhook.web.server import ServerOptions, WebhookServer, WorkerApp
from webhook.web.shared_metrics import start_metrics_server
from webhook.web.worker import HandshakeDeadline, ReviewWorker

REPO = Path(__file__).resolve().parents[2]


def test_gunicorn_settings(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    options = ServerOptions(cert_file=str(files.cert_file), key_file=str(files.key_file))
    tls = CertificateReloader(options.cert_file, options.key_file)
    built: list[int] = []

    def factory(t: CertificateReloader) -> WorkerApp:
        built.append(1)
        return WorkerApp(create_app(cluster=StaticClusterView(), ledger=InMemoryLedger()))

    server = WebhookServer(factory, options, tls)
    settings = server.settings()
    cfg = server.cfg

    assert not built  # nothing is built in the master
    assert cfg.worker_class_str == "webhook.web.worker.ReviewWorker"
    assert (cfg.workers, cfg.worker_connections) == (1, 1000)
    assert cfg.keepalive > 90  # longer than the API server's idle-connection timeout
    assert cfg.preload_app is False
    assert cfg.is_ssl
    assert cfg.bind == ["0.0.0.0:8443"]
    assert cfg.control_socket_disable is True
    assert settings["accesslog"] is None
    # The server's wrapper hands each connection the reloader's context, under a deadline.
    wrapper = cfg.ssl_context(cfg, lambda: None)
    assert isinstance(wrapper, HandshakeDeadline)
    assert (wrapper.tls, wrapper.timeout) == (tls, 10.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"workers": 0}, "at least 1"),
        ({"worker_connections": 0}, "at least 1"),
        ({"body_timeout": 0.0}, "must be positive"),
        ({"handshake_timeout": -1.0}, "must be positive"),
        ({"max_body_bytes": 0}, "at least 1"),
    ],
)
def test_impossible_options_are_refused(
    overrides: dict[str, Any], message: str, tmp_path: Path
) -> None:
    files = make_tls_files(tmp_path)
    options = replace(
        ServerOptions(cert_file=str(files.cert_file), key_file=str(files.key_file)), **overrides
    )
    with pytest.raises(ValueError, match=message):
        options.validate()


def test_ipv6_bind(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    options = ServerOptions(str(files.cert_file), str(files.key_file), host="::", port=9443)
    tls = CertificateReloader(options.cert_file, options.key_file)
    server = WebhookServer(
        lambda t: WorkerApp(create_app(cluster=StaticClusterView(), ledger=InMemoryLedger())),
        options,
        tls,
    )
    assert server.settings()["bind"] == ["[::]:9443"]


def test_a_connection_refused_unserved_is_counted_by_the_app(tmp_path: Path) -> None:
    """An overloaded worker resets a new connection before any request of it reaches the
    app: the worker tells the server, the server the app's ``refused`` hook."""
    files = make_tls_files(tmp_path)
    options = ServerOptions(str(files.cert_file), str(files.key_file))
    tls = CertificateReloader(options.cert_file, options.key_file)
    registry = CollectorRegistry()
    refused = Counter("refused", "connections refused", registry=registry)
    server = WebhookServer(
        lambda t: WorkerApp(
            create_app(cluster=StaticClusterView(), ledger=InMemoryLedger()), refused=refused.inc
        ),
        options,
        tls,
    )
    server.load()
    worker = ReviewWorker.__new__(ReviewWorker)  # only what refuse() reads
    worker.app = server
    worker._reset = {"count": 0, "told": 0.0}
    for _ in range(3):
        a, b = socket.socketpair()
        worker.refuse(a)
        b.close()
    assert 3.0 == registry.get_sample_value("refused_total")


def _spawn_server(tmp_path: Path, files: TLSFiles, port: int, *flags: str) -> ManagedProcess:
    """The walkthrough server of ``tests.unit.web_fixtures`` in a child process."""
    return spawn(
        "webhook",
        [
            sys.executable,
            "-m",
            "tests.unit.web_fixtures",
            "--cert",
            str(files.cert_file),
            "--key",
            str(files.key_file),
            "--port",
            str(port),
            *flags,
        ],
        tmp_path / "server.log",
        cwd=REPO,
    )


def test_app_and_services_live_in_the_worker_process(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    lifecycle = tmp_path / "lifecycle"
    lifecycle.mkdir()
    port = free_port()
    process = _spawn_server(tmp_path, files, port, "--lifecycle-dir", str(lifecycle))
    try:
        wait_for_tls(port, files.ca_file)
        deadline = time.monotonic() + 10
        while not (lifecycle / "started").exists():
            assert time.monotonic() < deadline, process.log_tail()
            time.sleep(0.05)
        master = int((lifecycle / "master").read_text())
        worker = int((lifecycle / "built").read_text())
        assert master == process.pid
        assert worker != master  # built after the fork
        assert worker == int((lifecycle / "started").read_text())
        assert not (lifecycle / "stopped").exists()
    finally:
        process.stop()
    assert worker == int((lifecycle / "stopped").read_text())  # worker_exit stopped them


def test_serve_refuses_an_unusable_certificate_before_forking(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    files.key_file.write_bytes(b"not a key")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.unit.web_fixtures",
            "--cert",
            str(files.cert_file),
            "--key",
            str(files.key_file),
            "--port",
            str(free_port()),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "TLSConfigError" in result.stderr
    assert "tls.key" in result.stderr


def test_metrics_server_serves_only_its_registry_and_stops() -> None:
    registry = CollectorRegistry()
    Counter("rpw_test_things", "things", registry=registry).inc(3)
    server = start_metrics_server(registry, host="127.0.0.1", port=0)
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        assert "rpw_test_things_total 3.0" in text
        assert "python_gc_objects_collected_total" not in text  # not the global registry
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    server.stop()  # idempotent


def _reviews_counted(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    return sum(
        float(m)
        for m in re.findall(rb"^resize_preemption_reviews_total{[^}]*} ([0-9.e+]+)$", text, re.M)
    )


def _post_reviews(port: int, ca_file: Path, count: int, prefix: str) -> None:
    for i in range(count):
        # A new connection each time, so that either worker may accept it.
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, context=client_context(ca_file), timeout=10
        )
        body = dumps(walkthrough_review(uid=f"{prefix}-{i}"))
        conn.request("POST", "/validate-resize", body, {"Content-Type": "application/json"})
        assert 200 == conn.getresponse().status
        conn.close()


def test_workers_count_into_one_view_that_outlives_a_worker(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    lifecycle = tmp_path / "lifecycle"
    lifecycle.mkdir()
    port, metrics_port = free_port(), free_port()
    process = _spawn_server(
        tmp_path,
        files,
        port,
        "--metrics-port",
        str(metrics_port),
        "--workers",
        "2",
        "--lifecycle-dir",
        str(lifecycle),
    )
    try:
        wait_for_tls(port, files.ca_file)
        deadline = time.monotonic() + 20
        while len(workers := sorted(lifecycle.glob("built-*"))) < 2:
            assert time.monotonic() < deadline, process.log_tail()
            time.sleep(0.05)
        pids = [int(w.name.removeprefix("built-")) for w in workers]
        assert process.pid not in pids

        _post_reviews(port, files.ca_file, 12, "first")
        assert 12 == _reviews_counted(metrics_port)

        # A worker dies; the master starts another. What the dead one counted stays.
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while len(list(lifecycle.glob("built-*"))) < 3:
            assert time.monotonic() < deadline, process.log_tail()
            time.sleep(0.05)
        _post_reviews(port, files.ca_file, 5, "second")
        assert 17 == _reviews_counted(metrics_port)
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("configured", "workers", "expected"),
    [
        pytest.param(
            "webhook-7f9c-abcde", 1, "webhook-7f9c-abcde", id="one-process-keeps-pod-name"
        ),
        pytest.param("webhook-7f9c-abcde", 2, "webhook-7f9c-abcde-4242", id="workers-told-apart"),
    ],
)
def test_process_identity(configured: str, workers: int, expected: str) -> None:
    assert expected == process_identity(configured, workers, 4242)


def test_process_identity_without_configuration_is_unique_per_process() -> None:
    assert process_identity("", 1, 11) != process_identity("", 1, 12)


def test_a_worker_of_several_waits_for_its_cache_and_keeps_its_heartbeat() -> None:
    answers = iter([False, False, False, True])
    heartbeats: list[float] = []

    class Worker:
        def notify(self) -> None:
            heartbeats.append(time.monotonic())

    WebhookServer._settle(Worker(), lambda: next(answers))

    assert 3 == len(heartbeats)
    assert [] == list(answers)  # it asked until the cache was synced, and no more


def test_a_client_library_imported_before_the_patch_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # urllib3 keeps the SSLContext class it found at import; the original one would
    # hand the Kubernetes client blocking sockets inside a gevent worker.
    import ssl
    import types

    from webhook.web.worker import CooperativeError, check_cooperative

    stale = types.ModuleType("urllib3.util.ssl_")
    stale.SSLContext = type("SSLContext", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "urllib3.util.ssl_", stale)
    with pytest.raises(CooperativeError, match="import it in the app factory"):
        check_cooperative()
    stale.SSLContext = ssl.SSLContext  # type: ignore[attr-defined]
    check_cooperative()
