"""The review port's TLS: version 1.2 with AEAD suites only, or 1.3, against a real client
(OpenSSL through :mod:`ssl`) offering one kind of suite at a time."""

from __future__ import annotations

import socket
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.launcher import free_port
from harness.processes import spawn
from tests.unit.web_fixtures import TLSFiles, client_context, make_tls_files, wait_for_tls
from webhook.tls.serving import CertificateReloader

REPO = Path(__file__).resolve().parents[2]

#: CBC suites with forward secrecy, for both key types: the ones a server that allowed
#: CBC at all would pick.
CBC = (
    "ECDHE-ECDSA-AES128-SHA256:ECDHE-RSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384:"
    "ECDHE-RSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA"
)
#: Suites without forward secrecy (RSA key exchange), AEAD or not.
STATIC_RSA = "AES128-GCM-SHA256:AES256-GCM-SHA384:AES128-SHA256:AES128-SHA"
AEAD = {
    "aes-gcm": "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256",
    "chacha20-poly1305": "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TLSFiles, int]]:
    directory = tmp_path_factory.mktemp("tls-suites")
    files, port = make_tls_files(directory), free_port()
    process = spawn(
        "webhook",
        [
            sys.executable,
            *("-m", "tests.unit.web_fixtures"),
            *("--cert", str(files.cert_file), "--key", str(files.key_file)),
            *("--port", str(port)),
        ],
        directory / "server.log",
        cwd=REPO,
    )
    try:
        wait_for_tls(port, files.ca_file)
        yield files, port
    finally:
        process.stop()


def _handshake(port: int, context: ssl.SSLContext) -> tuple[str, str | None]:
    """The cipher and version the server agreed to; ``ssl.SSLError`` when it refused."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cipher = tls.cipher()
        assert cipher is not None
        return cipher[0], tls.version()


def _tls12(files: TLSFiles, ciphers: str) -> ssl.SSLContext:
    context = client_context(files.ca_file)
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers)
    return context


@pytest.mark.parametrize("offered", [CBC, STATIC_RSA], ids=["ecdhe-cbc", "static-rsa"])
def test_a_tls12_client_offering_no_aead_forward_secret_suite_is_refused(
    served: tuple[TLSFiles, int], offered: str
) -> None:
    files, port = served
    with pytest.raises(ssl.SSLError, match=r"(?i)handshake failure|no shared cipher"):
        _handshake(port, _tls12(files, offered))


@pytest.mark.parametrize("suite", sorted(AEAD))
def test_a_tls12_client_offering_an_aead_suite_is_served(
    served: tuple[TLSFiles, int], suite: str
) -> None:
    files, port = served
    cipher, version = _handshake(port, _tls12(files, f"{CBC}:{AEAD[suite]}"))
    assert "TLSv1.2" == version
    assert cipher.startswith("ECDHE-") and suite.split("-")[0].upper() in cipher


def test_tls13_is_served(served: tuple[TLSFiles, int]) -> None:
    files, port = served
    context = client_context(files.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    assert "TLSv1.3" == _handshake(port, context)[1]


def test_every_tls12_suite_the_contexts_allow_is_aead_with_forward_secrecy(
    tmp_path: Path,
) -> None:
    files = make_tls_files(tmp_path)
    reloader = CertificateReloader(str(files.cert_file), str(files.key_file))
    for context in (reloader.context(), reloader.context(probes=True)):
        tls12 = [c for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]
        assert tls12, "no TLS 1.2 suite left"
        for cipher in tls12:
            assert cipher["aead"] and cipher["kea"] == "kx-ecdhe", cipher["name"]
