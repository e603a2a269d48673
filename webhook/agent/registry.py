"""Checkpoint images in an OCI registry: the layout the agent writes is pushed there instead
of imported into the node's runtime, so that a restored pod may pull it on any node.

The client speaks the few calls of the OCI distribution API a push and a delete need (blob
``HEAD``, upload ``POST`` then ``PUT``, manifest ``PUT``, ``HEAD`` and ``DELETE``), with
basic authentication or the bearer token challenge (``WWW-Authenticate: Bearer realm=...``,
the token fetched from the realm with the basic credentials), over urllib3, which the
Kubernetes client brings already. Credentials come from a docker ``config.json`` (a
``kubernetes.io/dockerconfigjson`` Secret mounted), keyed by the registry's host.

:class:`RegistryImages` is the agent's :class:`~webhook.agent.runtime.ImageStore` for it:
``store`` pushes, ``remove`` deletes the manifest by digest and the copy a kubelet pulled
onto this node.
"""

from __future__ import annotations

import base64
import json
import re
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlencode, urljoin

import urllib3

from webhook.agent.oci import MANIFEST_TYPE
from webhook.agent.runtime import Runtime, RuntimeFailure

_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_ACCEPT = ", ".join(
    (MANIFEST_TYPE, "application/vnd.oci.image.index.v1+json",
     "application/vnd.docker.distribution.manifest.v2+json")
)  # fmt: skip
_TIMEOUT = urllib3.Timeout(connect=10, read=300)


class RegistryFailure(RuntimeFailure):
    """A registry call failed; the message is one line."""


def credentials_for(config: Mapping[str, Any], host: str) -> tuple[str, str] | None:
    """The (user, password) a docker ``config.json`` holds for ``host``: its ``auths``
    entry under the host, with or without a scheme, as ``auth`` (base64 of ``user:password``)
    or ``username`` and ``password``."""
    auths = config.get("auths") if isinstance(config, Mapping) else None
    if not isinstance(auths, Mapping):
        return None
    for key, entry in auths.items():
        name = re.sub(r"^https?://", "", str(key)).split("/", 1)[0]
        if name != host or not isinstance(entry, Mapping):
            continue
        if entry.get("auth"):
            try:
                user, _, password = (
                    base64.b64decode(str(entry["auth"]), validate=True).decode().partition(":")
                )
            except (ValueError, UnicodeDecodeError):
                raise RegistryFailure(f"the credentials for {host} are not base64") from None
            return user, password
        if entry.get("username"):
            return str(entry["username"]), str(entry.get("password", ""))
    return None


def load_credentials(path: Path, host: str) -> tuple[str, str] | None:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RegistryFailure(f"registry credentials {path}: {e}") from None
    return credentials_for(config, host)


@dataclass(frozen=True)
class Pushed:
    reference: str
    digest: str


@dataclass
class RegistryClient:
    """One registry (``host``, ``https`` unless ``scheme`` says otherwise), its CA file
    (None: the system's) and credentials."""

    host: str
    ca_file: Path | None = None
    credentials: tuple[str, str] | None = None
    scheme: str = "https"
    _pool: urllib3.PoolManager = field(init=False, repr=False)
    _auth: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        ca = str(self.ca_file) if self.ca_file else None
        self._pool = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED", ca_certs=ca, timeout=_TIMEOUT, retries=False
        )

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.host}{path}"

    # --- authentication -------------------------------------------------------------------

    def _basic(self) -> str:
        if self.credentials is None:
            raise RegistryFailure(f"{self.host} asks for credentials and none are given")
        user, password = self.credentials
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def _authorize(self, repository: str, challenge: str) -> None:
        """Answer a 401's ``WWW-Authenticate``: basic credentials, or a bearer token from
        the challenge's realm (asked with the basic credentials when there are any)."""
        scheme, _, rest = challenge.partition(" ")
        if scheme.lower() == "basic":
            self._auth[repository] = self._basic()
            return
        if scheme.lower() != "bearer":
            raise RegistryFailure(f"{self.host} asks for {scheme or 'unknown'} authentication")
        params = dict(_CHALLENGE_PARAM.findall(rest))
        realm = params.pop("realm", "")
        if not realm:
            raise RegistryFailure(f"{self.host}'s bearer challenge names no realm")
        headers = {"Authorization": self._basic()} if self.credentials else {}
        query = urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
        response = self._pool.request(
            "GET", f"{realm}?{query}" if query else realm, headers=headers
        )
        if response.status != 200:
            raise RegistryFailure(f"token from {realm}: HTTP {response.status}")
        try:
            body = json.loads(response.data)
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise RegistryFailure(f"token from {realm}: no token in the answer")
        self._auth[repository] = f"Bearer {token}"

    def _request(
        self,
        method: str,
        path_or_url: str,
        repository: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: Callable[[], IO[bytes] | bytes] | None = None,
        expect: tuple[int, ...] = (200,),
    ) -> urllib3.BaseHTTPResponse:
        """One call, answered once more after a 401's challenge is met; the body is made
        anew for the second try (a stream is read once)."""
        url = path_or_url if "://" in path_or_url else self.url(path_or_url)
        for attempt in range(2):
            sent = dict(headers or {})
            if repository in self._auth:
                sent["Authorization"] = self._auth[repository]
            try:
                response = self._pool.request(
                    method, url, headers=sent, body=body() if body else None,
                    preload_content=True, redirect=method in ("GET", "HEAD"),
                )  # fmt: skip
            except urllib3.exceptions.HTTPError as e:
                raise RegistryFailure(f"registry {self.host}: {_said(method, url)}: {e}") from None
            if response.status == 401 and attempt == 0:
                self._authorize(repository, response.headers.get("WWW-Authenticate", ""))
                continue
            if response.status == 401:
                said = _said(method, url)
                raise RegistryFailure(
                    f"registry {self.host}: {said}: HTTP 401 with the credentials given"
                )
            if response.status in expect:
                return response
            raise RegistryFailure(f"registry {self.host}: {_said(method, url)}: {_why(response)}")
        raise AssertionError("unreachable: the second attempt returns or raises")

    # --- blobs and manifests --------------------------------------------------------------

    def has_blob(self, repository: str, digest: str) -> bool:
        response = self._request(
            "HEAD", f"/v2/{repository}/blobs/{digest}", repository, expect=(200, 404)
        )
        return response.status == 200

    def put_blob(
        self, repository: str, digest: str, size: int, content: Callable[[], IO[bytes] | bytes]
    ) -> None:
        """A monolithic upload: ``POST`` opens it, one ``PUT`` of the whole blob ends it."""
        if self.has_blob(repository, digest):
            return
        opened = self._request(
            "POST", f"/v2/{repository}/blobs/uploads/", repository, expect=(202,),
            headers={"Content-Length": "0"},
        )  # fmt: skip
        location = opened.headers.get("Location", "")
        if not location:
            raise RegistryFailure(f"{self.host} opened an upload without a Location")
        url = urljoin(self.url("/"), location)
        url += ("&" if "?" in url else "?") + urlencode({"digest": digest})
        self._request(
            "PUT", url, repository, body=content, expect=(201,),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )  # fmt: skip

    def put_manifest(self, repository: str, tag: str, manifest: bytes, media_type: str) -> str:
        response = self._request(
            "PUT", f"/v2/{repository}/manifests/{tag}", repository, body=lambda: manifest,
            headers={"Content-Type": media_type}, expect=(201,),
        )  # fmt: skip
        return response.headers.get("Docker-Content-Digest", "")

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest of the manifest ``reference`` (a tag or a digest) names; None: none."""
        response = self._request(
            "HEAD", f"/v2/{repository}/manifests/{reference}", repository,
            headers={"Accept": _ACCEPT}, expect=(200, 404),
        )  # fmt: skip
        if response.status == 404:
            return None
        return response.headers.get("Docker-Content-Digest") or None

    def delete_manifest(self, repository: str, digest: str) -> None:
        """Delete by digest (the API deletes manifests only so); gone already is fine."""
        self._request(
            "DELETE", f"/v2/{repository}/manifests/{digest}", repository, expect=(202, 404)
        )

    # --- an image layout ------------------------------------------------------------------

    def push_layout(self, layout: Path, reference: str) -> Pushed:
        """Push the one image of the OCI image layout tar ``layout`` as ``reference``
        (``host/repository:tag``): its blobs, streamed out of the tar, then its manifest."""
        repository, tag = parse_reference(reference, self.host)
        try:
            with tarfile.open(layout, "r:") as tar:
                members = {m.name: m for m in tar.getmembers() if m.isfile()}

                def blob(digest: str) -> Callable[[], IO[bytes]]:
                    member = members.get(f"blobs/{digest.replace(':', '/')}")
                    if member is None:
                        raise RegistryFailure(f"{layout.name} lacks the blob {digest}")
                    return lambda: _extract(tar, member)

                if "index.json" not in members:
                    raise RegistryFailure(f"{layout.name} has no index.json")
                index = json.loads(_extract(tar, members["index.json"]).read())
                (entry,) = index["manifests"]
                manifest_bytes = blob(entry["digest"])().read()
                manifest = json.loads(manifest_bytes)
                for descriptor in [manifest["config"], *manifest["layers"]]:
                    self.put_blob(
                        repository, descriptor["digest"], int(descriptor["size"]),
                        blob(descriptor["digest"]),
                    )  # fmt: skip
        except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as e:
            raise RegistryFailure(f"{layout.name} is not an image layout: {e}") from None
        media_type = entry.get("mediaType") or MANIFEST_TYPE
        digest = self.put_manifest(repository, tag, manifest_bytes, media_type)
        return Pushed(reference, digest or entry["digest"])

    def delete(self, reference: str) -> None:
        """Delete the manifest ``reference`` names (its tag goes with it); gone already is
        fine."""
        repository, tag = parse_reference(reference, self.host)
        digest = self.manifest_digest(repository, tag)
        if digest is not None:
            self.delete_manifest(repository, digest)


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    stream = tar.extractfile(member)
    if stream is None:
        raise RegistryFailure(f"{member.name} is not a file")
    return stream


def parse_reference(reference: str, host: str) -> tuple[str, str]:
    """``host/a/b:tag`` -> (``a/b``, ``tag``), for a reference on ``host``."""
    name, _, tag = reference.rpartition(":")
    if not tag or "/" in tag or "@" in name or not name.startswith(host + "/"):
        raise RegistryFailure(f"{reference} is not an image of {host} with a tag")
    return name.removeprefix(host + "/"), tag


def _said(method: str, url: str) -> str:
    """``METHOD path`` for a message: the path without its query, digests cut to 12 hex
    digits (the message is one line of a record)."""
    path = re.sub(r"^https?://[^/]+", "", url).split("?", 1)[0]
    return f"{method} " + re.sub(r"(sha256:[0-9a-f]{12})[0-9a-f]+", r"\1", path)


def _why(response: urllib3.BaseHTTPResponse) -> str:
    try:
        errors = json.loads(response.data or b"{}").get("errors") or []
        detail = "; ".join(str(e.get("message") or e.get("code")) for e in errors)
    except (ValueError, AttributeError):
        detail = ""
    return f"HTTP {response.status}" + (f": {detail}" if detail else "")


@dataclass
class RegistryImages:
    """Checkpoint images pushed under ``repository`` (``host[:port]/path``): the agent's
    image store when a registry is set."""

    repository: str
    client: RegistryClient
    #: The node's runtime: a restored pod's kubelet pulled the image into it, and that copy
    #: holds the process's memory too.
    runtime: Runtime

    def reference(self, namespace: str, pod: str, container: str, uid: str) -> str:
        return f"{self.repository}/{namespace}/{pod}/{container}:{uid[:12]}".lower()

    def store(self, layout: Path, reference: str) -> None:
        self.client.push_layout(layout, reference)

    def remove(self, reference: str) -> None:
        """The copies a kubelet pulled onto this node first (the CRI names a pulled image
        by its tag and by ``name@digest``; the runtime takes its id with the last of
        them), then the manifest in the registry: a runtime failure leaves the manifest,
        and so the digest, for the next pass."""
        if not reference.startswith(self.client.host + "/"):
            self.runtime.remove_image(reference)
            return
        repository, _ = parse_reference(reference, self.client.host)
        digest = self.client.manifest_digest(repository, reference.rpartition(":")[2])
        pulled = [reference]
        if digest is not None:
            pulled.append(f"{self.client.host}/{repository}@{digest}")
        for name in pulled:
            self.runtime.remove_image(name)
        if digest is not None:
            self.client.delete_manifest(repository, digest)

    def sweep(self) -> list[str]:
        """Copies pulled onto this node of images the registry no longer has: a pod
        restored here from another node's record, whose agent deleted the manifest when
        the record ended, and removed only its own node's copy. Each under every name the
        CRI gave it under the repository (tag, ``name@digest``); the runtime takes the
        image id with the last of them."""
        listed = self.runtime.image_digests()
        prefix = self.repository + "/"
        gone = set()
        for name, digest in listed.items():
            if not name.startswith(prefix):
                continue
            repository, _, reference = name.removeprefix(self.client.host + "/").partition("@")
            if not reference:
                repository, reference = parse_reference(name, self.client.host)
            if self.client.manifest_digest(repository, reference) is None:
                gone.add(digest)
        stale = sorted(n for n, d in listed.items() if d in gone and n.startswith(prefix))
        for name in stale:
            self.runtime.remove_image(name)
        return stale
