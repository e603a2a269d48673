"""Certificate rotation without a restart, TLS 1.2 minimum, HTTPS only.

Clients here connect by IP address, so they send no SNI - as the API server does when a
webhook's URL or Service resolves to an IP.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import ssl
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

from harness import pki as harness_pki
from harness.launcher import free_port
from harness.processes import ManagedProcess, spawn
from tests.unit.web_fixtures import (
    TLSFiles,
    client_context,
    make_tls_files,
    peer_serial,
    replace_file,
    review_latency,
    serial_of,
    wait_for_tls,
    walkthrough_review,
)
from webhook.tls import pki
from webhook.tls.serving import CertificateReloader, TLSConfigError

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- a plain ssl server that keeps ONE context (the sni_callback path) ---------------------


class FixedContextServer:
    """Wraps every accepted socket with the context it was given at start, like servers
    that never ask for a new one; completes the handshake and closes."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.server_errors: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError) as e:
                self.server_errors.append(str(e))
                conn.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def tls_files(tmp_path: Path) -> TLSFiles:
    return make_tls_files(tmp_path)


@pytest.fixture
def fixed_server(tls_files: TLSFiles) -> Iterator[tuple[FixedContextServer, CertificateReloader]]:
    reloader = CertificateReloader(
        str(tls_files.cert_file), str(tls_files.key_file), check_interval=0
    )
    server = FixedContextServer(reloader.context())
    yield server, reloader
    server.close()


def test_new_connections_see_the_rotated_certificate_without_sni(
    tls_files: TLSFiles, fixed_server: tuple[FixedContextServer, CertificateReloader]
) -> None:
    server, reloader = fixed_server
    first = peer_serial(server.port, tls_files.ca_file)
    assert reloader.serial == first

    rotated = tls_files.rotate()

    assert rotated != first
    assert rotated == peer_serial(server.port, tls_files.ca_file)
    assert rotated == reloader.serial


def test_a_mismatched_pair_keeps_the_old_one_until_the_right_key_arrives(
    tls_files: TLSFiles,
    fixed_server: tuple[FixedContextServer, CertificateReloader],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, reloader = fixed_server
    first = peer_serial(server.port, tls_files.ca_file)

    # Half-way through a rotation: the new certificate is there, its key is not.
    pair = pki.make_serving_cert(tls_files.ca, ip_addresses=["127.0.0.1"])
    replace_file(tls_files.cert_file, pair.cert_pem)
    assert first == peer_serial(server.port, tls_files.ca_file)
    assert reloader.loaded()
    assert "do not load" in caplog.text

    replace_file(tls_files.key_file, pair.key_pem)
    assert serial_of(pair.cert_pem) == peer_serial(server.port, tls_files.ca_file)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda f: f.cert_file.unlink(), id="certificate-missing"),
        pytest.param(lambda f: f.key_file.unlink(), id="key-missing"),
        pytest.param(lambda f: replace_file(f.cert_file, b"-----BEGIN CERT"), id="truncated"),
        pytest.param(lambda f: replace_file(f.key_file, b""), id="empty-key"),
        pytest.param(
            lambda f: replace_file(f.key_file, harness_pki.generate_private_key_pem()),
            id="other-key",
        ),
    ],
)
def test_broken_files_keep_the_pair_in_service(tls_files: TLSFiles, damage: object) -> None:
    reloader = CertificateReloader(
        str(tls_files.cert_file), str(tls_files.key_file), check_interval=0
    )
    serial = reloader.serial
    before = reloader.context()

    damage(tls_files)  # type: ignore[operator]

    assert reloader.context() is before
    assert serial == reloader.serial
    assert reloader.loaded()
    assert not reloader.reload()


def test_secret_volume_symlink_swap_is_followed(tmp_path: Path) -> None:
    # How the kubelet updates a Secret volume: files are links into ..data, a link to a
    # timestamped directory; an update writes a new directory and swaps ..data.
    ca = pki.make_ca("ca")

    def publish(name: str) -> int:
        pair = pki.make_serving_cert(ca, ip_addresses=["127.0.0.1"])
        directory = tmp_path / name
        directory.mkdir()
        (directory / "tls.crt").write_bytes(pair.cert_pem)
        (directory / "tls.key").write_bytes(pair.key_pem)
        tmp_link = tmp_path / "..data_tmp"
        tmp_link.symlink_to(name)
        os.replace(tmp_link, tmp_path / "..data")
        return serial_of(pair.cert_pem)

    first = publish("..2025_01_01")
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    reloader = CertificateReloader(
        str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), check_interval=0
    )
    assert first == reloader.serial

    second = publish("..2025_02_01")

    reloader.context()
    assert second == reloader.serial


def test_checks_are_rate_limited(tls_files: TLSFiles) -> None:
    clock = FakeClock()
    reloader = CertificateReloader(
        str(tls_files.cert_file), str(tls_files.key_file), check_interval=5, clock=clock
    )
    first = reloader.serial
    rotated = tls_files.rotate()

    clock.now += 4.9
    reloader.context()
    assert first == reloader.serial

    clock.now += 0.2
    reloader.context()
    assert rotated == reloader.serial


def test_an_unusable_first_pair_is_an_error_naming_the_files(tls_files: TLSFiles) -> None:
    replace_file(tls_files.key_file, harness_pki.generate_private_key_pem())
    with pytest.raises(TLSConfigError, match=r"tls\.crt"):
        CertificateReloader(str(tls_files.cert_file), str(tls_files.key_file))
    with pytest.raises(TLSConfigError, match="missing"):
        CertificateReloader(str(tls_files.cert_file), "/nonexistent/missing.key")


def test_an_expired_certificate_is_not_ready(tmp_path: Path) -> None:
    ca = pki.make_ca("ca")
    expired = pki.make_serving_cert(ca, ip_addresses=["127.0.0.1"], validity=-timedelta(minutes=1))
    (tmp_path / "tls.crt").write_bytes(expired.cert_pem)
    (tmp_path / "tls.key").write_bytes(expired.key_pem)
    reloader = CertificateReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    assert not reloader.loaded()


def test_context_settings(tls_files: TLSFiles) -> None:
    context = CertificateReloader(str(tls_files.cert_file), str(tls_files.key_file)).context()
    assert ssl.TLSVersion.TLSv1_2 == context.minimum_version
    assert context.verify_mode == ssl.CERT_NONE


# -- protocol versions and plain HTTP ------------------------------------------------------


def _tls11_client() -> ssl.SSLContext:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
        client.minimum_version = ssl.TLSVersion.TLSv1_1
        client.maximum_version = ssl.TLSVersion.TLSv1_1
        # OpenSSL 3 will not even offer TLS 1.1 at the default security level.
        client.set_ciphers("DEFAULT:@SECLEVEL=0")
    return client


def _tls11_possible(tls_files: TLSFiles) -> bool:
    """Control: this client does speak TLS 1.1 to a server that allows it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lax = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        lax.minimum_version = ssl.TLSVersion.TLSv1_1
        lax.set_ciphers("DEFAULT:@SECLEVEL=0")
    lax.load_cert_chain(tls_files.cert_file, tls_files.key_file)
    server = FixedContextServer(lax)
    try:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            _tls11_client().wrap_socket(raw) as tls,
        ):
            return tls.version() == "TLSv1.1"
    except ssl.SSLError:
        return False
    finally:
        server.close()


def _assert_tls11_refused(port: int) -> None:
    with (
        pytest.raises(ssl.SSLError, match=r"(?i)protocol version|unsupported protocol"),
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        _tls11_client().wrap_socket(raw),
    ):
        pass


def _assert_plain_http_refused(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            reply = raw.recv(4096)
        except ConnectionResetError:
            reply = b""
    assert not reply.startswith(b"HTTP/"), reply


def test_tls_1_1_is_refused_tls_1_2_accepted(
    tls_files: TLSFiles, fixed_server: tuple[FixedContextServer, CertificateReloader]
) -> None:
    if not _tls11_possible(tls_files):
        pytest.skip("this OpenSSL build cannot speak TLS 1.1 at all")
    server, _ = fixed_server
    _assert_tls11_refused(server.port)

    client = client_context(tls_files.ca_file)
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() == "TLSv1.2"


# -- the real server: gunicorn gthread in a child process -----------------------------------


@contextlib.contextmanager
def running_server(tls_files: TLSFiles, tmp_path: Path) -> Iterator[tuple[int, int]]:
    port, metrics_port = free_port(), free_port()
    process: ManagedProcess = spawn(
        "webhook",
        [
            sys.executable,
            "-m",
            "tests.unit.web_fixtures",
            "--cert",
            str(tls_files.cert_file),
            "--key",
            str(tls_files.key_file),
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
        ],
        tmp_path / "server.log",
        cwd=REPO,
    )
    try:
        try:
            wait_for_tls(port, tls_files.ca_file)
        except OSError:
            pytest.fail(f"server did not start:\n{process.log_tail()}")
        yield port, metrics_port
    finally:
        process.stop()
    assert not process.running()


def _post(tls: ssl.SSLSocket, path: str, body: bytes) -> tuple[int, bytes]:
    tls.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += tls.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += tls.recv(65536)
    return int(head.split(b" ")[1]), rest


def test_gunicorn_server_rotates_certificates_and_refuses_old_protocols(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    with running_server(tls_files, tmp_path) as (port, metrics_port):
        first = peer_serial(port, tls_files.ca_file)

        # A kept-alive connection from before the rotation.
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        old = client_context(tls_files.ca_file).wrap_socket(raw, server_hostname="127.0.0.1")
        review = orjson.dumps(walkthrough_review())
        status, body = _post(old, "/validate-resize", review)
        assert status == 200
        assert orjson.loads(body)["response"]["allowed"] is True

        rotated = tls_files.rotate()
        deadline = time.monotonic() + 10
        while (seen := peer_serial(port, tls_files.ca_file)) != rotated:
            assert time.monotonic() < deadline, f"still serving {seen:x}, not {rotated:x}"
            time.sleep(0.05)
        assert first != rotated

        # The old connection keeps working: rotation never cuts a connection.
        status, _ = _post(old, "/validate-resize", review)
        assert status == 200
        old.close()

        _assert_plain_http_refused(port)
        if _tls11_possible(tls_files):
            _assert_tls11_refused(port)

        # /metrics is plain HTTP on its own port, and counts what this worker served.
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=5) as m:
            m.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            text = b""
            while chunk := m.recv(65536):
                text += chunk
        assert text.startswith(b"HTTP/1.0 200") or text.startswith(b"HTTP/1.1 200")
        assert b'resize_preemption_reviews_total{endpoint="validate",verdict="preempt"} 2.0' in text


def test_plain_http_refused_by_fixed_context_server(
    fixed_server: tuple[FixedContextServer, CertificateReloader],
) -> None:
    server, _ = fixed_server
    _assert_plain_http_refused(server.port)


def test_rotation_under_load_fails_no_review_and_serves_the_new_certificate_at_once(
    tls_files: TLSFiles, tmp_path: Path
) -> None:
    # Reviews flow from 4 clients, a new connection each (each handshake picks the pair
    # in service), while the pair is replaced 3 times - certificate first, then key, as
    # a writer that is not a Secret volume does: a moment of mismatch included.
    with running_server(tls_files, tmp_path) as (port, _):
        answered: list[float] = []
        stop = threading.Event()

        def load(client: int) -> None:
            i = 0
            while not stop.is_set() and i < 2000:
                answered.append(review_latency(port, tls_files.ca_file, uid=f"load-{client}-{i}"))
                i += 1

        clients = [threading.Thread(target=load, args=(k,)) for k in range(4)]
        for t in clients:
            t.start()
        took: list[float] = []
        try:
            for _ in range(3):
                time.sleep(0.5)
                rotated = tls_files.rotate()
                t0 = time.monotonic()
                while peer_serial(port, tls_files.ca_file) != rotated:
                    assert time.monotonic() - t0 < 10, "the new certificate is not served"
                    time.sleep(0.01)
                took.append(time.monotonic() - t0)
            time.sleep(0.5)
        finally:
            stop.set()
            for t in clients:
                t.join(30)
    failed = sum(1 for x in answered if x == math.inf)
    assert (0, True) == (failed, len(answered) > 100), f"{failed} of {len(answered)} failed"
    assert max(took) < 2.0, took
