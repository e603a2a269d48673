"""One attempt of the leader elector (``tryAcquireOrRenew``) against an in-memory Lease
that checks ``resourceVersion`` as the API server does; the loops are in
tests/e2e/test_leader.py."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from webhook.kube.leader import LeaderElector, LeaderRecord

PATH = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/leader"
ME = "me"


class _Response(io.BytesIO):
    status = 200


class FakeLeases:
    """One Lease behind ``param_serialize``/``call_api``; a PUT carrying another
    ``resourceVersion`` than the stored one fails with 409, as does a POST over one."""

    def __init__(self, spec: dict[str, Any] | None = None) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.calls: list[str] = []
        self.fail: set[str] = set()
        if spec is not None:
            self._store({"metadata": {"name": "leader", "namespace": "ns"}, "spec": spec})

    def _store(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return self.lease

    def param_serialize(self, **kwargs: Any) -> tuple[str, str, Any]:
        return kwargs["method"], kwargs["resource_path"], kwargs["body"]

    def call_api(self, method: str, path: str, body: Any, **_: Any) -> _Response:
        self.calls.append(method)
        if method in self.fail:
            raise ApiException(status=500, reason="Internal Server Error")
        if method == "GET":
            if self.lease is None:
                raise ApiException(status=404, reason="Not Found")
            return _Response(orjson.dumps(self.lease))
        if method == "POST":
            if self.lease is not None:
                raise ApiException(status=409, reason="AlreadyExists")
            return _Response(orjson.dumps(self._store(body)))
        assert method == "PUT" and path == PATH and self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return _Response(orjson.dumps(self._store(body)))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elector(api: FakeLeases, monotonic: Callable[[], float]) -> LeaderElector:
    return LeaderElector(
        api,
        namespace="ns",
        name="leader",
        identity=ME,
        lease_duration=15.0,
        renew_deadline=10.0,
        retry_period=2.0,
        on_started_leading=lambda: None,
        on_stopped_leading=lambda: None,
        clock=lambda: 1_700_000_000.0,
        monotonic=monotonic,
    )


@dataclass(frozen=True)
class AttemptCase:
    """The Lease's spec before (``None``: none), how long this replica watched it
    unchanged before the attempt, and the outcome: whether it holds the Lease, the
    holder and transitions stored, and the requests sent."""

    spec: dict[str, Any] | None
    watched: float
    holds: bool
    holder: str
    transitions: int
    calls: tuple[str, ...]


OTHER = {"holderIdentity": "other", "leaseDurationSeconds": 15, "leaseTransitions": 3}

ATTEMPT_CASES = [
    pytest.param(AttemptCase(None, 0.0, True, ME, 0, ("GET", "POST")), id="none-is-created"),
    pytest.param(
        AttemptCase(OTHER, 0.0, False, "other", 3, ("GET",)), id="another-holder-is-respected"
    ),
    pytest.param(
        AttemptCase(OTHER, 16.0, True, ME, 4, ("GET", "GET", "PUT")),
        id="an-expired-holder-is-taken-over",
    ),
    pytest.param(
        AttemptCase({**OTHER, "holderIdentity": ""}, 0.0, True, ME, 4, ("GET", "PUT")),
        id="a-released-lease-is-taken",
    ),
]


@pytest.mark.parametrize("case", ATTEMPT_CASES)
def test_one_attempt(case: AttemptCase) -> None:
    api, clock = FakeLeases(case.spec), Clock()
    candidate = elector(api, clock)
    if case.watched:
        assert not candidate._try_acquire_or_renew()  # first sight starts the local clock
        clock.now += case.watched

    holds = candidate._try_acquire_or_renew()

    assert api.lease is not None
    stored = LeaderRecord.from_spec(api.lease["spec"])
    assert (case.holds, case.holder, case.transitions, case.calls) == (
        holds,
        stored.holder,
        stored.transitions,
        tuple(api.calls),
    )


def test_the_leader_renews_with_one_write_and_keeps_its_acquire_time() -> None:
    api, clock = FakeLeases(), Clock()
    leader = elector(api, clock)
    assert leader._try_acquire_or_renew()
    acquired = LeaderRecord.from_spec(api.lease["spec"] if api.lease else {})
    api.calls.clear()

    clock.now += 2.0
    assert leader._try_acquire_or_renew()

    assert ["PUT"] == api.calls
    assert api.lease is not None
    renewed = LeaderRecord.from_spec(api.lease["spec"])
    assert (acquired.acquire_time, 0) == (renewed.acquire_time, renewed.transitions)


def test_a_failed_fast_renewal_reads_the_lease_again() -> None:
    api, clock = FakeLeases(), Clock()
    leader = elector(api, clock)
    assert leader._try_acquire_or_renew()
    assert api.lease is not None
    api.lease["metadata"]["resourceVersion"] = "written-by-someone-else"
    api.calls.clear()

    assert leader._try_acquire_or_renew()

    assert ["PUT", "GET", "PUT"] == api.calls


def test_an_api_server_failure_is_no_leadership() -> None:
    api, clock = FakeLeases(), Clock()
    api.fail.add("GET")

    assert not elector(api, clock)._try_acquire_or_renew()
    assert ["GET"] == api.calls
