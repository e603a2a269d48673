"""A real OCI registry for the checkpoint tests: CNCF Distribution's ``registry``
(``scripts/build-registry.sh``), serving TLS with a certificate of its own CA and basic
authentication from an htpasswd file (bcrypt, hashed by the script's ``bcrypt-hash``),
with deletes enabled, its storage on the filesystem under a directory of its own.

    with TestRegistry(directory, address="198.18.0.1") as registry:
        registry.host              # "198.18.0.1:PORT"
        registry.ca_file           # the CA that signed its certificate
        registry.docker_config()   # {"auths": {host: {"auth": ...}}}
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness.launcher import free_port
from harness.processes import ManagedProcess, spawn
from webhook.pki import make_ca, make_serving_cert

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_REGISTRY = REPO_ROOT / "scripts" / "build-registry.sh"
USER = "rpw-agent"


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


def registry_config(root: Path, port: int, *, htpasswd: Path, cert: Path, key: Path) -> str:
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
        "auth": {"htpasswd": {"realm": "rpw-checkpoints", "path": str(htpasswd)}},
    }
    return json.dumps(config, indent=2)


class TestRegistry:
    """The registry on ``address`` (an IP address of this machine its certificate names),
    one user with a random password; use as a context manager or start()/stop()."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, *, address: str = "127.0.0.1") -> None:
        self.directory = directory
        self.address = address
        self.port = 0
        self.password = secrets.token_urlsafe(18)
        self.process: ManagedProcess | None = None

    @property
    def host(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    def docker_config(self) -> dict[str, Any]:
        auth = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        return {"auths": {self.host: {"auth": auth}}}

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
        htpasswd = self.directory / "htpasswd"
        htpasswd.write_text(f"{USER}:{bcrypt_hash(tools, self.password)}\n")
        self.port = free_port()
        config = self.directory / "config.yml"
        config.write_text(registry_config(self.directory, self.port, htpasswd=htpasswd,
                                          cert=cert, key=key))  # fmt: skip
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
            request.add_header("Authorization", self.basic_header())
        if accept:
            request.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError):
            return 0

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
