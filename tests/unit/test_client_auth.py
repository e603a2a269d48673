"""Client certificates on the review port (``client-ca``, ``client-cn``), the probe port
beside it, and the warning and metric while any caller is accepted."""

from __future__ import annotations

import socket
import ssl
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import pki as harness_pki
from harness.launcher import free_port
from harness.processes import ManagedProcess, spawn
from tests.unit.web_fixtures import TLSFiles, client_context, dumps, make_tls_files
from tests.unit.web_fixtures import walkthrough_review as review
from webhook.base.settings import DEFAULT_CLIENT_CN
from webhook.tls import pki
from webhook.tls.serving import CertificateReloader, TLSConfigError

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Callers:
    """The CA the server is given, a client certificate it signed for the default
    ``client-cn``, one another CA signed for that name, and one the CA signed for another
    name (a kubelet's, as a cluster CA signs)."""

    ca_file: Path
    cert: Path
    key: Path
    stranger_cert: Path
    stranger_key: Path
    other_name_cert: Path
    other_name_key: Path


def _callers(directory: Path) -> Callers:
    ca, other = pki.make_ca("callers"), pki.make_ca("strangers")
    good = harness_pki.make_client_cert(ca, DEFAULT_CLIENT_CN)
    bad = harness_pki.make_client_cert(other, DEFAULT_CLIENT_CN)
    named = harness_pki.make_client_cert(ca, "system:node:node-1", groups=["system:nodes"])
    files = Callers(
        directory / "client-ca.crt",
        directory / "client.crt",
        directory / "client.key",
        directory / "stranger.crt",
        directory / "stranger.key",
        directory / "other-name.crt",
        directory / "other-name.key",
    )
    for path, data in (
        (files.ca_file, ca.cert_pem),
        (files.cert, good.cert_pem),
        (files.key, good.key_pem),
        (files.stranger_cert, bad.cert_pem),
        (files.stranger_key, bad.key_pem),
        (files.other_name_cert, named.cert_pem),
        (files.other_name_key, named.key_pem),
    ):
        path.write_bytes(data)
    return files


def _exchange(port: int, context: ssl.SSLContext, request: bytes) -> bytes:
    """The server's whole answer to ``request`` (b"" when it closed without one); raises
    ``ssl.SSLError`` when the handshake is refused (TLS 1.3 tells the client so on its
    first read)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(request)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                break
        return data


def _post_review() -> bytes:
    body = dumps(review(uid="client-auth"))
    return (
        "POST /validate-resize HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


GET_READYZ = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def _with_cert(tls_files: TLSFiles, cert: Path, key: Path) -> ssl.SSLContext:
    context = client_context(tls_files.ca_file)
    context.load_cert_chain(str(cert), str(key))
    return context


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TLSFiles, Callers, int, int]]:
    directory = tmp_path_factory.mktemp("client-auth")
    tls_files, callers = make_tls_files(directory), _callers(directory)
    port, probe_port = free_port(), free_port()
    process: ManagedProcess = spawn(
        "webhook",
        [
            sys.executable,
            "-m",
            "tests.unit.web_fixtures",
            *("--cert", str(tls_files.cert_file), "--key", str(tls_files.key_file)),
            *("--port", str(port), "--probe-port", str(probe_port)),
            *("--client-ca", str(callers.ca_file)),
        ],
        directory / "server.log",
        cwd=REPO,
    )
    try:
        context = _with_cert(tls_files, callers.cert, callers.key)
        for _ in range(300):
            try:
                _exchange(port, context, GET_READYZ)
                break
            except OSError:
                if not process.running():
                    break
                time.sleep(0.05)
        else:
            pytest.fail(f"server did not start:\n{process.log_tail()}")
        yield tls_files, callers, port, probe_port
    finally:
        process.stop()


def test_a_caller_with_a_certificate_the_ca_signed_gets_its_review_answered(
    served: tuple[TLSFiles, Callers, int, int],
) -> None:
    tls_files, callers, port, _ = served
    answer = _exchange(port, _with_cert(tls_files, callers.cert, callers.key), _post_review())
    assert b"HTTP/1.1 200" == answer[:12]


@pytest.mark.parametrize("caller", ["no certificate", "another CA's certificate"])
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_caller_without_the_api_servers_certificate_is_refused_at_the_handshake(
    served: tuple[TLSFiles, Callers, int, int], caller: str, version: ssl.TLSVersion
) -> None:
    tls_files, callers, port, _ = served
    context = (
        client_context(tls_files.ca_file)
        if caller == "no certificate"
        else _with_cert(tls_files, callers.stranger_cert, callers.stranger_key)
    )
    context.minimum_version = context.maximum_version = version
    if version == ssl.TLSVersion.TLSv1_2:
        # TLS 1.2: the server's verdict on the client certificate ends the handshake.
        with (
            pytest.raises(ssl.SSLError, match=r"(?i)handshake failure|unknown ca"),
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ):
            context.wrap_socket(raw, server_hostname="127.0.0.1")
        return
    # TLS 1.3: the client's side of the handshake ends before the server has checked its
    # certificate; the server's alert (or the closed connection) comes instead of an answer.
    with pytest.raises(OSError):
        _exchange(port, context, _post_review())


@pytest.mark.parametrize(
    "version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"]
)
def test_a_certificate_the_ca_signed_for_another_name_than_client_cn_is_refused(
    served: tuple[TLSFiles, Callers, int, int], version: ssl.TLSVersion
) -> None:
    tls_files, callers, port, _ = served
    context = _with_cert(tls_files, callers.other_name_cert, callers.other_name_key)
    context.minimum_version = context.maximum_version = version
    # The handshake completes (the CA signed it); the server closes before any answer.
    try:
        answer = _exchange(port, context, _post_review())
    except OSError:
        answer = b""
    assert b"" == answer


def test_client_cn_is_the_name_a_certificate_must_bear(tmp_path: Path) -> None:
    tls_files, callers = make_tls_files(tmp_path), _callers(tmp_path)
    reloader = CertificateReloader(
        str(tls_files.cert_file),
        str(tls_files.key_file),
        client_ca=str(callers.ca_file),
        client_cn="system:node:node-1",
    )
    assert "system:node:node-1" == reloader.client_cn
    open_door = CertificateReloader(str(tls_files.cert_file), str(tls_files.key_file))
    assert DEFAULT_CLIENT_CN == open_door.client_cn


def test_the_probe_port_answers_probes_without_a_certificate_and_nothing_else(
    served: tuple[TLSFiles, Callers, int, int],
) -> None:
    tls_files, _, _, probe_port = served
    context = client_context(tls_files.ca_file)
    assert b"HTTP/1.1 200" == _exchange(probe_port, context, GET_READYZ)[:12]
    assert b"" == _exchange(probe_port, context, _post_review())


def test_a_client_ca_file_without_a_certificate_stops_the_server(tmp_path: Path) -> None:
    tls_files = make_tls_files(tmp_path)
    (tmp_path / "empty.crt").write_text("")
    with pytest.raises(TLSConfigError, match="client CA"):
        CertificateReloader(
            str(tls_files.cert_file), str(tls_files.key_file), client_ca=str(tmp_path / "empty.crt")
        )


@pytest.mark.parametrize(
    ("client_ca", "verify_mode"),
    [(False, ssl.CERT_NONE), (True, ssl.CERT_REQUIRED)],
    ids=["no client-ca", "client-ca"],
)
def test_the_review_context_requires_a_client_certificate_only_with_a_ca(
    tmp_path: Path, client_ca: bool, verify_mode: ssl.VerifyMode
) -> None:
    tls_files, callers = make_tls_files(tmp_path), _callers(tmp_path)
    reloader = CertificateReloader(
        str(tls_files.cert_file),
        str(tls_files.key_file),
        client_ca=str(callers.ca_file) if client_ca else None,
    )
    assert verify_mode == reloader.context().verify_mode
    assert ssl.CERT_NONE == reloader.context(probes=True).verify_mode
    assert client_ca == reloader.authenticates
