"""A real OCI registry for the checkpoint tests: CNCF Distribution's ``registry``
(``scripts/build-registry.sh``), serving TLS with a certificate of its own CA and basic
authentication from an htpasswd file (bcrypt, hashed by the script's ``bcrypt-hash``),
with deletes enabled, its storage on the filesystem under a directory of its own.

With ``auth="token"`` it asks for bearer tokens instead (the registry token
authentication the docker and OCI clients speak): :class:`TokenServer`, a small token
service here, checks the same user and password and grants the scopes asked for, as ES256
JSON web tokens whose ``x5c`` certificate the registry verifies against a CA of its own.

    with TestRegistry(directory, address="198.18.0.1") as registry:
        registry.host              # "198.18.0.1:PORT"
        registry.ca_file           # the CA that signed its certificate
        registry.docker_config()   # {"auths": {host: {"auth": ...}}}
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.launcher import free_port
from harness.processes import ManagedProcess, spawn
from webhook.tls.pki import CertificateAuthority, KeyPair, issue, make_ca, make_serving_cert

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_REGISTRY = REPO_ROOT / "scripts" / "build-registry.sh"
USER = "rpw-agent"
TOKEN_SERVICE = "rpw-test-registry"
TOKEN_ISSUER = "rpw-test-token-service"


class RegistryUnavailable(RuntimeError):
    """The registry could not be built or did not start."""


def ensure_registry() -> Path:
    """The directory holding ``registry`` and ``bcrypt-hash``, built on first use."""
    result = subprocess.run(
        ["bash", str(BUILD_REGISTRY)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
        check=False,
    )  # fmt: skip
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RegistryUnavailable(f"{BUILD_REGISTRY.name} failed (exit {result.returncode})")
    return Path(lines[-1])


def bcrypt_hash(tools: Path, password: str) -> str:
    result = subprocess.run(
        [str(tools / "bcrypt-hash")], input=password + "\n", capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return result.stdout.strip()


def registry_config(root: Path, port: int, *, cert: Path, key: Path, auth: dict[str, Any]) -> str:
    """The registry's configuration (YAML, written as JSON, which YAML reads)."""
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(root / "data")},
            # Deleting a manifest is how the agent ends a checkpoint.
            "delete": {"enabled": True},
        },
        "http": {
            "addr": f"0.0.0.0:{port}",
            "tls": {"certificate": str(cert), "key": str(key)},
            "debug": {"addr": ""},
        },
        "auth": auth,
    }
    return json.dumps(config, indent=2)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_token(signer: KeyPair, claims: dict[str, Any]) -> str:
    """An ES256 JSON web token of ``claims``, its ``x5c`` the signer's certificate."""
    cert = x509.load_pem_x509_certificate(signer.cert_pem)
    header = {
        "alg": "ES256",
        "typ": "JWT",
        "x5c": [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()],
    }
    signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    key = serialization.load_pem_private_key(signer.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


class TokenServer:
    """The token service of the registry's bearer challenge: ``GET /token?service=&scope=``
    with the user's basic credentials answers a token granting the scopes asked for;
    anything else 401. ``requests`` counts the tokens handed out."""

    def __init__(self, ca: CertificateAuthority, serving: KeyPair, directory: Path,
                 password: str, address: str) -> None:  # fmt: skip
        self.signing_ca = make_ca("rpw test token issuer")
        self.signer = issue(
            self.signing_ca,
            subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TOKEN_ISSUER)]),
            usage=ExtendedKeyUsageOID.CLIENT_AUTH, sans=[], validity=dt.timedelta(days=1),
        )  # fmt: skip
        self.root_bundle = directory / "token-ca.crt"
        self.root_bundle.write_bytes(self.signing_ca.cert_pem)
        self.password = password
        self.requests = 0
        cert, key = directory / "token-tls.crt", directory / "token-tls.key"
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = ThreadingHTTPServer((address, 0), self._handler())
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.realm = f"https://{address}:{self.server.server_address[1]}/token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def grant(self, query: dict[str, list[str]], *, counted: bool = True) -> str:
        now = int(time.time())
        access = []
        for scope in query.get("scope", []):
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        claims = {"iss": TOKEN_ISSUER, "sub": USER, "aud": query.get("service", [""])[0],
                  "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": secrets.token_hex(8), "access": access}  # fmt: skip
        self.requests += counted
        return signed_token(self.signer, claims)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self
        expected = "Basic " + base64.b64encode(f"{USER}:{self.password}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/token" or self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.end_headers()
                    return
                token = server.grant(parse_qs(url.query))
                body = json.dumps({"token": token, "access_token": token, "expires_in": 300})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                return

        return Handler

    def auth_config(self) -> dict[str, Any]:
        token = {"realm": self.realm, "service": TOKEN_SERVICE, "issuer": TOKEN_ISSUER}
        return {"token": {**token, "rootcertbundle": str(self.root_bundle)}}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TestRegistry:
    """The registry on ``address`` (an IP address of this machine its certificate names),
    one user with a random password; use as a context manager or start()/stop()."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        directory: Path,
        *,
        address: str = "127.0.0.1",
        auth: Literal["basic", "token"] = "basic",
    ) -> None:
        self.directory = directory
        self.address = address
        self.auth = auth
        self.port = 0
        self.password = secrets.token_urlsafe(18)
        self.process: ManagedProcess | None = None
        self.token_server: TokenServer | None = None

    @property
    def host(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    def docker_config(self) -> dict[str, Any]:
        auth = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        return {"auths": {self.host: {"auth": auth}}}

    def authorization(self, path: str) -> str:
        """What to send for ``path``: the basic credentials, or a token granting everything
        on the path's repository."""
        if self.token_server is None:
            return self.basic_header()
        name = path.removeprefix("/v2/").split("/blobs/")[0].split("/manifests/")[0]
        scope = [f"repository:{name}:pull,push,delete"] if path != "/v2/" else []
        token = self.token_server.grant({"service": [TOKEN_SERVICE], "scope": scope}, counted=False)
        return f"Bearer {token}"

    def basic_header(self) -> str:
        return "Basic " + base64.b64encode(f"{USER}:{self.password}".encode()).decode()

    def __enter__(self) -> TestRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30) -> TestRegistry:
        tools = ensure_registry()
        self.directory.mkdir(parents=True, exist_ok=True)
        ca = make_ca("rpw test registry CA")
        serving = make_serving_cert(ca, ip_addresses=[self.address], dns_names=["localhost"])
        self.ca_file.write_bytes(ca.cert_pem)
        cert, key = self.directory / "tls.crt", self.directory / "tls.key"
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        key.chmod(0o600)
        if self.auth == "token":
            self.token_server = TokenServer(ca, serving, self.directory, self.password,
                                            self.address)  # fmt: skip
            auth = self.token_server.auth_config()
        else:
            htpasswd = self.directory / "htpasswd"
            htpasswd.write_text(f"{USER}:{bcrypt_hash(tools, self.password)}\n")
            auth = {"htpasswd": {"realm": "rpw-checkpoints", "path": str(htpasswd)}}
        self.port = free_port()
        config = self.directory / "config.yml"
        config.write_text(registry_config(self.directory, self.port, cert=cert, key=key,
                                          auth=auth))  # fmt: skip
        self.process = spawn(
            "registry", [str(tools / "registry"), "serve", str(config)],
            self.directory / "registry.log",
        )  # fmt: skip
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if not self.process.running:
                raise RegistryUnavailable(f"the registry exited:\n{self.process.log_tail()}")
            if self.status("GET", "/v2/", authorized=True) == 200:
                return
            if time.monotonic() > deadline:
                raise RegistryUnavailable(
                    f"the registry not serving after {timeout:.0f} s:\n{self.process.log_tail()}"
                )
            time.sleep(0.2)

    def status(self, method: str, path: str, *, authorized: bool = True,
               accept: str = "") -> int:  # fmt: skip
        """The status the registry answers ``method path`` with (0: no answer)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(f"https://{self.host}{path}", method=method)
        if authorized:
            request.add_header("Authorization", self.authorization(path))
        if accept:
            request.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError):
            return 0

    def manifest(self, reference: str) -> dict[str, Any]:
        """The OCI manifest ``host/repository:tag`` names, as any client reads it."""
        name, _, tag = reference.removeprefix(self.host + "/").rpartition(":")
        path = f"/v2/{name}/manifests/{tag}"
        request = urllib.request.Request(f"https://{self.host}{path}")
        request.add_header("Authorization", self.authorization(path))
        request.add_header("Accept", "application/vnd.oci.image.manifest.v1+json")
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return dict(json.loads(response.read()))

    def manifest_status(self, reference: str) -> int:
        """What ``HEAD`` of the manifest ``host/repository:tag`` answers."""
        name, _, tag = reference.removeprefix(self.host + "/").rpartition(":")
        accept = "application/vnd.oci.image.manifest.v1+json"
        return self.status("HEAD", f"/v2/{name}/manifests/{tag}", accept=accept)

    def log_text(self) -> str:
        return (self.directory / "registry.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        if self.token_server is not None:
            self.token_server.stop()
            self.token_server = None
