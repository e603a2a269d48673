"""A small JSON client for the Kubernetes REST API, used by the harness itself.

The official client deserializes every object into models, which is slow and has no
informer; the harness needs raw dicts, list+watch and precise error handling, so it
talks HTTP directly (urllib3 is already a dependency of the official client). Tests use the
official client on top of the same kubeconfig.

Thread-safe: one connection pool shared by all threads.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson
import urllib3
import yaml


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code, ``body`` the decoded Status if any."""

    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status = status
        self.body = body
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", "")) if isinstance(self.body, dict) else ""


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 or an ERROR event with code 410)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API server is and how to authenticate: file paths, PEM client certificate."""

    server: str
    ca_file: Path
    cert_file: Path
    key_file: Path


class KubeClient:
    """JSON over HTTPS to one API server with a client certificate."""

    def __init__(self, credentials: Credentials, *, timeout: float = 15.0, maxsize: int = 8):
        self.credentials = credentials
        url = urlsplit(credentials.server)
        context = ssl.create_default_context(cafile=str(credentials.ca_file))
        context.load_cert_chain(str(credentials.cert_file), str(credentials.key_file))
        self._pool = urllib3.HTTPSConnectionPool(
            url.hostname or "127.0.0.1",
            url.port or 443,
            ssl_context=context,
            maxsize=maxsize,
            block=False,
            retries=False,
            timeout=urllib3.Timeout(connect=5.0, read=timeout),
        )
        self._timeout = timeout
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str]) -> KubeClient:
        """Build a client from the current context of a kubeconfig with embedded cert data."""
        config = yaml.safe_load(Path(path).read_text())
        ctx_name = config["current-context"]
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        tmp = tempfile.TemporaryDirectory(prefix="kubeapi-")
        files = {}
        for name, key in (
            ("ca.crt", (cluster, "certificate-authority")),
            ("tls.crt", (user, "client-certificate")),
            ("tls.key", (user, "client-key")),
        ):
            section, field = key
            target = Path(tmp.name) / name
            if f"{field}-data" in section:
                target.write_bytes(base64.b64decode(section[f"{field}-data"]))
            else:
                target.write_bytes(Path(section[field]).read_bytes())
            target.chmod(0o600)
            files[name] = target
        client = cls(
            Credentials(cluster["server"], files["ca.crt"], files["tls.crt"], files["tls.key"])
        )
        client._tempdir = tmp
        return client

    def close(self) -> None:
        self._pool.close()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    # --- plain requests ----------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """Send one request; returns the decoded JSON body or raises :class:`ApiError`."""
        url = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        payload = None
        if body is not None:
            payload = body if isinstance(body, bytes) else orjson.dumps(body)
            headers["Content-Type"] = content_type
        response = self._pool.urlopen(
            method,
            url,
            body=payload,
            headers=headers,
            timeout=urllib3.Timeout(connect=5.0, read=timeout or self._timeout),
        )
        data = response.data
        decoded: Any = None
        if data:
            try:
                decoded = orjson.loads(data)
            except orjson.JSONDecodeError:
                decoded = data.decode(errors="replace")
        if response.status >= 300:
            raise ApiError(response.status, decoded, method, path)
        return decoded

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def get_or_none(self, path: str) -> Any:
        """Like :meth:`get`, but None when the object does not exist (404)."""
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        content_type = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
        }[kind]
        return self.request("PATCH", path, body=body, content_type=content_type)

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body=body)

    def ready(self, timeout: float = 2.0) -> bool:
        """True when /readyz answers 200."""
        try:
            response = self._pool.urlopen(
                "GET", "/readyz", timeout=urllib3.Timeout(connect=timeout, read=timeout)
            )
        except (urllib3.exceptions.HTTPError, OSError):
            return False
        return response.status == 200

    # --- list + watch ------------------------------------------------------------------

    def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        stop: threading.Event | None = None,
        on_response: Any = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield watch events (``{"type": ..., "object": ...}``) until the server closes.

        Bookmarks are requested so ``resource_version`` can advance on quiet streams.
        Raises :class:`WatchExpired` when the version is too old: relist and start again.
        ``on_response`` receives the streaming response so another thread can shut it down.
        """
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        response = self._pool.urlopen(
            "GET",
            f"{path}?{urlencode(query)}",
            headers={"Accept": "application/json"},
            preload_content=False,
            timeout=urllib3.Timeout(connect=5.0, read=timeout_seconds + 30),
        )
        try:
            if response.status == 410:
                raise WatchExpired(path)
            if response.status >= 300:
                raise ApiError(response.status, response.data, "WATCH", path)
            if on_response is not None:
                on_response(response)
            buffer = b""
            for chunk in response.stream(64 * 1024, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    if event.get("type") == "ERROR":
                        if event.get("object", {}).get("code") == 410:
                            raise WatchExpired(path)
                        raise ApiError(
                            int(event.get("object", {}).get("code") or 500),
                            event.get("object"),
                            "WATCH",
                            path,
                        )
                    yield event
                if stop is not None and stop.is_set():
                    return
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError, OSError):
            # The server closed the stream or we shut it down: the caller re-watches.
            return
        finally:
            with contextlib.suppress(Exception):
                response.release_conn()
