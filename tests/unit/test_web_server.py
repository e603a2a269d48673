"""The gunicorn wrapper and the metrics server: settings, process model, lifecycle."""

from __future__ import annotations

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

from tests.harness.launcher import free_port
from tests.harness.processes import spawn
from tests.unit.web_fixtures import make_tls_files, wait_for_tls
from webhook.web.app import create_app
from webhook.web.metrics_server import start_metrics_server
from webhook.web.server import DEFAULT_THREADS, ServerOptions, WebhookServer, WorkerApp
from webhook.web.tls import CertificateReloader

REPO = Path(__file__).resolve().parents[2]


def test_gunicorn_settings(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    options = ServerOptions(cert_file=str(files.cert_file), key_file=str(files.key_file))
    tls = CertificateReloader(options.cert_file, options.key_file)
    built: list[int] = []

    def factory(t: CertificateReloader) -> WorkerApp:
        built.append(1)
        return WorkerApp(create_app())

    server = WebhookServer(factory, options, tls)
    settings = server.settings()
    cfg = server.cfg

    assert not built  # nothing is built in the master
    assert cfg.worker_class_str == "gthread"
    assert (cfg.workers, cfg.threads) == (1, DEFAULT_THREADS) == (1, 4)
    assert cfg.keepalive > 90  # longer than the API server's idle-connection timeout
    assert cfg.preload_app is False
    assert cfg.is_ssl
    assert cfg.bind == ["0.0.0.0:8443"]
    assert cfg.control_socket_disable is True
    assert settings["accesslog"] is None
    # The per-connection hook hands out the reloading context.
    assert cfg.ssl_context(cfg, lambda: None) is tls.context()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"workers": 2}, "metrics port needs workers=1"),
        ({"threads": 0}, "at least 1"),
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
    server = WebhookServer(lambda t: WorkerApp(create_app()), options, tls)
    assert server.settings()["bind"] == ["[::]:9443"]


def test_app_and_services_live_in_the_worker_process(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    lifecycle = tmp_path / "lifecycle"
    lifecycle.mkdir()
    port = free_port()
    process = spawn(
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
            "--lifecycle-dir",
            str(lifecycle),
        ],
        tmp_path / "server.log",
        cwd=REPO,
    )
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
