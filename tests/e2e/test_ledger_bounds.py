"""The ledger's bounds on the real API server: two replicas sharing the ledger Leases, one
with a clock 30 s off; a node's Lease full.

Every replica reads an entry on its own clock, as of when it first saw it
(:func:`webhook.engine.ledger.on_local_clock`): the replica whose clock is off neither drops
the other's fresh entries when it writes (the keep rule, :func:`states.to_keep`) nor
counts their room after the TTL. A write past a node's bound on entries writes nothing,
and says so in a log line and ``resize_preemption_ledger_full_total``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.model import PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import MAX_NODE_ENTRIES, LedgerEntry, LedgerFull
from webhook.engine.lifecycle import states
from webhook.kube.client import make_api_client
from webhook.kube.ledger import LEDGER_ANNOTATION, LeaseLedger, lease_name

pytestmark = pytest.mark.e2e

NODE = "node-1"
#: Short, so the test sees an entry through its whole life.
TTL = 6.0


def _entry(review: str, now: float) -> LedgerEntry:
    """An admission at ``now`` (its writer's clock) of a pod no cache holds: it holds room
    until it expires."""
    asked = Resources(100, 64 * 2**20)
    return LedgerEntry(
        pod=PodRef("default", f"pod-{review}", f"uid-{review}"),
        node=NODE,
        review_uid=review,
        resources=asked,
        desired=(("app", asked),),
        victims=(),
        admitted_at=now,
        expires_at=now + TTL,
    )


def _admitting(new: LedgerEntry, now: float) -> Any:
    """What an admission writes: the keep rule applied to what is there, and ``new``."""

    def change(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...], None]:
        return (*states.to_keep(entries, (), now), new), None

    return change


def _holding(replica: LeaseLedger, now: float) -> set[str]:
    return {e.review_uid for e in states.room_holders(replica.entries(NODE), (), now)}


def _until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def replicas(
    cluster: Any, namespace: str, request: pytest.FixtureRequest
) -> Iterator[tuple[LeaseLedger, LeaseLedger, Callable[[], float]]]:
    """Replica A on this machine's clock, replica B on one ``request.param`` seconds off;
    yields both and B's clock."""
    offset: float = request.param
    clock_b = lambda: time.time() + offset  # noqa: E731
    made = []
    for identity, clock in (("replica-a", time.time), ("replica-b", clock_b)):
        replica = LeaseLedger(
            make_api_client(str(cluster.kubeconfig)),
            Config(namespace=namespace, identity=identity, reservation_ttl=TTL),
            metrics=Metrics(),
            clock=clock,
            close_client=True,
        )
        replica.start()
        made.append(replica)
    for replica in made:
        assert replica.wait_synced(30), "the Lease watch did not sync"
    yield made[0], made[1], clock_b
    for replica in made:
        replica.stop()


@pytest.mark.parametrize("replicas", [30.0, -30.0], ids=["ahead", "behind"], indirect=True)
def test_a_replica_whose_clock_is_off_keeps_fresh_entries_and_no_room_past_the_ttl(
    cluster: Any,
    namespace: str,
    replicas: tuple[LeaseLedger, LeaseLedger, Callable[[], float]],
) -> None:
    a, b, clock_b = replicas
    admitted = time.time()
    a.update(NODE, _admitting(_entry("r-a", admitted), admitted))
    _until(lambda: "r-a" in {e.review_uid for e in b.entries(NODE)}, "replica B saw A's entry")

    # B counts A's fresh entry as holding room, and its own admission keeps it.
    assert {"r-a"} == _holding(b, clock_b())
    b.update(NODE, _admitting(_entry("r-b", clock_b()), clock_b()))
    lease = cluster.client.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease_name(NODE)}"
    )
    stored = lease["metadata"]["annotations"][LEDGER_ANNOTATION]
    assert "r-a" in stored and "r-b" in stored
    assert {"r-a", "r-b"} == _holding(b, clock_b())

    # Once the TTL has passed since A admitted it, B holds A's room no longer.
    time.sleep(max(0.0, admitted + TTL + 0.5 - time.time()))
    assert "r-a" not in _holding(b, clock_b())
    # Nor does A hold B's, whatever B's clock wrote into it.
    time.sleep(1.5)
    assert set() == _holding(a, time.time())


@pytest.mark.parametrize("replicas", [0.0], ids=["same-clock"], indirect=True)
def test_a_full_lease_refuses_the_write_says_so_and_counts_it(
    cluster: Any,
    namespace: str,
    replicas: tuple[LeaseLedger, LeaseLedger, Callable[[], float]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, _, _ = replicas
    now = time.time()
    full = tuple(_entry(f"r-{i}", now) for i in range(MAX_NODE_ENTRIES))
    a.update(NODE, lambda _: (full, None))
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease_name(NODE)}"
    version = cluster.client.get(path)["metadata"]["resourceVersion"]

    with pytest.raises(LedgerFull, match=f"ledger of node {NODE} full"):
        a.update(NODE, _admitting(_entry("one-more", now), now))

    assert version == cluster.client.get(path)["metadata"]["resourceVersion"]
    metrics = a._metrics
    assert metrics is not None
    assert 1 == metrics.registry.get_sample_value("resize_preemption_ledger_full_total")
    assert any("full" in r.getMessage() and NODE in r.getMessage() for r in caplog.records)
