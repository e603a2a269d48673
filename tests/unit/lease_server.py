"""A stand-in for the API server's Lease endpoints behind an ``ApiClient``, and the
entries the Lease ledger's unit tests write through it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from webhook.core.model import PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry


@dataclass
class _Response:
    status: int
    body: bytes

    def read(self) -> bytes:
        return self.body


@dataclass
class LeaseServer:
    """Stands in for the API server's Lease endpoints behind an ``ApiClient``."""

    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 0

    def param_serialize(self, **request: Any) -> tuple[Any, ...]:
        return (request["method"], request["resource_path"], request.get("body"))

    def call_api(self, method: str, path: str, body: Any, **_: Any) -> _Response:
        name = body["metadata"]["name"] if method == "POST" else path.rsplit("/", 1)[1]
        found = self.leases.get(name)
        if method == "GET":
            if found is None:
                raise ApiException(status=404, reason="Not Found")
            return _Response(200, json.dumps(found).encode())
        stale = found is not None and (
            method == "POST"
            or found["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]
        )
        if stale:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        self.leases[name] = stored
        return _Response(201 if method == "POST" else 200, json.dumps(stored).encode())


def entry(pod: str, node: str, expires_at: float) -> LedgerEntry:
    return LedgerEntry(
        pod=PodRef("default", pod, f"uid-{pod}"),
        node=node,
        review_uid=f"review-{pod}",
        resources=Resources(1000, 2**30),
        desired=(("app", Resources(1000, 2**30)),),
        victims=(),
        admitted_at=100.0,
        expires_at=expires_at,
    )


def add(new: LedgerEntry) -> Callable[[tuple[LedgerEntry, ...]], Any]:
    return lambda entries: ((*entries, new), None)
