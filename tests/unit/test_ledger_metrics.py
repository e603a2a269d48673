"""``resize_preemption_ledger_entries``: the Lease ledger exports how many admitted resizes
hold room."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from webhook.base.metrics import Metrics
from webhook.core.model import PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry
from webhook.kube.ledger import LeaseLedger


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


def drop(pod: str) -> Callable[[tuple[LedgerEntry, ...]], Any]:
    return lambda entries: (tuple(e for e in entries if e.pod.name != pod), None)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gauge(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("resize_preemption_ledger_entries")


@pytest.fixture
def clock() -> Clock:
    return Clock(100.0)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def ledger(metrics: Metrics, clock: Clock) -> LeaseLedger:
    return LeaseLedger(LeaseServer(), metrics=metrics, clock=clock)


def test_an_empty_ledger_holds_no_entries(ledger: LeaseLedger, metrics: Metrics) -> None:
    assert 0.0 == gauge(metrics)


def test_admitted_entries_are_counted_on_every_node(ledger: LeaseLedger, metrics: Metrics) -> None:
    ledger.update("node-1", add(entry("a", "node-1", 200.0)))
    ledger.update("node-1", add(entry("b", "node-1", 200.0)))
    ledger.update("node-2", add(entry("c", "node-2", 200.0)))

    assert 3.0 == gauge(metrics)


def test_released_entries_are_no_longer_counted(ledger: LeaseLedger, metrics: Metrics) -> None:
    ledger.update("node-1", add(entry("a", "node-1", 200.0)))
    ledger.update("node-1", add(entry("b", "node-1", 200.0)))

    ledger.update("node-1", drop("a"))

    assert 1.0 == gauge(metrics)


def test_expired_entries_are_not_counted_before_anyone_writes(
    ledger: LeaseLedger, metrics: Metrics, clock: Clock
) -> None:
    ledger.update("node-1", add(entry("a", "node-1", 150.0)))
    ledger.update("node-1", add(entry("b", "node-1", 200.0)))

    clock.now = 150.0

    assert 1.0 == gauge(metrics)


def test_entries_written_by_another_replica_are_counted(metrics: Metrics, clock: Clock) -> None:
    server = LeaseServer()
    other = LeaseLedger(server, clock=clock)
    other.update("node-1", add(entry("a", "node-1", 200.0)))
    other.update("node-1", add(entry("b", "node-1", 200.0)))
    ledger = LeaseLedger(server, metrics=metrics, clock=clock)

    # Its first write conflicts with the other replica's Lease and reads it.
    ledger.update("node-1", add(entry("c", "node-1", 200.0)))

    assert 3.0 == gauge(metrics)
