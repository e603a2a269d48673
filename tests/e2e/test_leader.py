"""Leader election on a real Lease: one leader at a time, fast handover, expiry takeover."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.e2e.conftest import Cluster, Waiter
from webhook.base.metrics import Metrics
from webhook.kube.leader import LeaderElector

pytestmark = pytest.mark.e2e

LEASE = "resize-preemption-webhook"
# Short timings keep the tests quick; they keep client-go's ratios valid.
LEASE_DURATION = 3.0
RENEW_DEADLINE = 2.0
RETRY_PERIOD = 0.5


@dataclass
class Candidate:
    """One replica: its elector, its metrics and what its callbacks saw."""

    identity: str
    elector: LeaderElector
    metrics: Metrics
    started: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)

    @property
    def gauge(self) -> float | None:
        return self.metrics.registry.get_sample_value(
            "resize_preemption_leader_election_master_status"
        )


Elect = Callable[..., Candidate]


@pytest.fixture
def elect(api_client: k8s.ApiClient, namespace: str) -> Iterator[Elect]:
    """``elect(identity, **options)``: a new (not yet started) candidate; all are stopped
    after the test."""
    made: list[Candidate] = []

    def make(identity: str, **kwargs: Any) -> Candidate:
        metrics = Metrics()
        started: list[float] = []
        stopped: list[float] = []
        elector = LeaderElector(
            api_client,
            namespace=namespace,
            name=LEASE,
            identity=identity,
            lease_duration=LEASE_DURATION,
            renew_deadline=RENEW_DEADLINE,
            retry_period=RETRY_PERIOD,
            on_started_leading=lambda: started.append(time.monotonic()),
            on_stopped_leading=lambda: stopped.append(time.monotonic()),
            metrics=metrics,
            **kwargs,
        )
        made.append(Candidate(identity, elector, metrics, started, stopped))
        return made[-1]

    yield make
    for candidate in made:
        candidate.elector.stop(timeout=10)


def lease(cluster: Cluster, namespace: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.client.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"
    )
    return result


def leaders(*cs: Candidate) -> list[str]:
    return [c.identity for c in cs if c.elector.is_leader()]


def test_two_electors_one_leader_and_fast_handover_on_stop(
    cluster: Cluster, namespace: str, elect: Elect, wait_until: Waiter
) -> None:
    a = elect("replica-a")
    b = elect("replica-b")
    a.elector.start()
    b.elector.start()

    first = wait_until(lambda: leaders(a, b), timeout=10, what="a leader")
    assert len(first) == 1

    # Watch for a while: never two leaders, and the same one throughout.
    overlap = threading.Event()
    deadline = time.monotonic() + 2 * LEASE_DURATION
    while time.monotonic() < deadline:
        now = leaders(a, b)
        if len(now) > 1 or (now and now != first):
            overlap.set()
        time.sleep(0.02)
    assert not overlap.is_set()

    leader, follower = (a, b) if first == ["replica-a"] else (b, a)
    spec = lease(cluster, namespace)["spec"]
    assert spec["holderIdentity"] == leader.identity
    assert spec["leaseDurationSeconds"] == int(LEASE_DURATION)
    assert spec["leaseTransitions"] == 0
    assert leader.gauge == 1 and follower.gauge == 0
    assert len(leader.started) == 1 and not follower.started

    stopped_at = time.monotonic()
    leader.elector.stop(timeout=10)

    assert leader.stopped and not leader.elector.is_leader()
    wait_until(lambda: follower.elector.is_leader(), timeout=LEASE_DURATION, what="handover")
    handover = follower.started[0] - stopped_at
    # Released, not expired: within about two jittered retry periods.
    assert handover < LEASE_DURATION
    spec = lease(cluster, namespace)["spec"]
    assert spec["holderIdentity"] == follower.identity
    assert spec["leaseTransitions"] == 1
    assert leader.gauge == 0 and follower.gauge == 1


def test_a_crashed_leader_is_replaced_after_the_lease_expires(
    cluster: Cluster, namespace: str, elect: Elect, wait_until: Waiter
) -> None:
    # release_on_stop=False: stopping behaves like a process that died holding the Lease.
    a = elect("replica-a", release_on_stop=False)
    a.elector.start()
    wait_until(lambda: a.elector.is_leader(), timeout=10, what="replica-a to lead")
    b = elect("replica-b")
    b.elector.start()
    time.sleep(RETRY_PERIOD * 3)
    assert not b.elector.is_leader()

    died_at = time.monotonic()
    a.elector.stop(timeout=10)
    assert lease(cluster, namespace)["spec"]["holderIdentity"] == "replica-a"

    wait_until(
        lambda: b.elector.is_leader(),
        timeout=LEASE_DURATION + 3 * RETRY_PERIOD * 2.2 + 1,
        what="takeover after expiry",
    )
    waited = b.started[0] - died_at
    # Not before the lease expired as b observed it (b saw the last renewal before a died).
    assert waited >= LEASE_DURATION - RETRY_PERIOD - 0.1
    assert lease(cluster, namespace)["spec"]["leaseTransitions"] == 1


def test_a_lease_held_by_someone_else_is_respected(
    cluster: Cluster, namespace: str, elect: Elect
) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now))
    cluster.client.create(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
        {
            "metadata": {"name": LEASE},
            "spec": {
                "holderIdentity": "someone-else",
                "leaseDurationSeconds": 60,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 4,
            },
        },
    )
    a = elect("replica-a")
    a.elector.start()
    time.sleep(LEASE_DURATION + 1)  # longer than our own lease duration: theirs counts
    assert not a.elector.is_leader()
    assert a.elector.leader() == "someone-else"
    assert not a.started


def test_invalid_timings_are_refused(api_client: k8s.ApiClient) -> None:
    def noop() -> None:
        return None

    for lease_duration, renew, retry in ((2, 2, 0.5), (3, 1, 1), (3, 2, 0)):
        with pytest.raises(ValueError):
            LeaderElector(
                api_client,
                namespace="default",
                name=LEASE,
                identity="x",
                lease_duration=lease_duration,
                renew_deadline=renew,
                retry_period=retry,
                on_started_leading=noop,
                on_stopped_leading=noop,
            )
