"""The cluster cache and the Lease ledger against the real local API server.

* the cache lists and watches pods, nodes, PDBs and PriorityClasses: objects created with
  kubectl or the client appear, deleted ones go, subscribers hear about both;
* a watch from a compacted resourceVersion gets 410 Gone and the reflector relists;
* the ledger under contention: two ``LeaseLedger`` instances (two processes' worth, each
  with its own client) and 8 threads on each add an entry to the same node at once - every
  entry survives and conflicts were counted.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3

from harness.launcher import ControlPlane, ControlPlaneConfig
from tests.e2e.conftest import NODE, Cluster, Kubectl, Waiter
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.errors import ObjectError
from webhook.core.model import PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry
from webhook.kube.cache import PODS, ClusterCache
from webhook.kube.client import ApiClient, make_api_client
from webhook.kube.errors import NotFound
from webhook.kube.ledger import LABELS, LEDGER_ANNOTATION, LeaseLedger, lease_name
from webhook.kube.reflector import Reflector

pytestmark = pytest.mark.e2e


def pod_body(name: str, cpu: str = "100m", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "cache-test"}},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }
            ],
        },
    }


@pytest.fixture
def api(cluster: Cluster) -> Iterator[ApiClient]:
    client = make_api_client(str(cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def cache(api: ApiClient) -> Iterator[ClusterCache]:
    metrics = Metrics()
    cache = ClusterCache(api, Config(resync_period=600), metrics=metrics, close_client=False)
    cache.start()
    try:
        assert cache.wait_synced(30), "cache did not sync"
        yield cache
    finally:
        cache.stop()


def test_cache_follows_pods_nodes_budgets_and_priority_classes(
    cluster: Cluster, cache: ClusterCache, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    events: list[tuple[str, str, str]] = []

    def record(kind: str, kind_of_change: str, old: Any, new: Any) -> None:
        view = new if new is not None else old
        events.append((kind, kind_of_change, getattr(view, "name", "")))

    cache.subscribe(record)
    node = cache.node(NODE)
    assert node is not None and node.allocatable.cpu == 8000
    assert cache.age() < 30

    api = cluster.client
    api.create(f"/api/v1/namespaces/{namespace}/pods", pod_body("by-client", "250m"))
    kubectl("apply", "-f", "-", input=json.dumps(pod_body("by-kubectl", "500m")))
    kubectl(
        "create",
        "poddisruptionbudget",
        "cache-pdb",
        "--selector=app=cache-test",
        "--min-available=1",
    )
    pc_name = f"cache-test-{secrets.token_hex(3)}"
    kubectl("create", "priorityclass", pc_name, "--value=4242")

    def ours() -> list[str]:
        return sorted(p.name for p in cache.pods_on(NODE) if p.namespace == namespace)

    wait_until(lambda: ours() == ["by-client", "by-kubectl"], what="pods in the cache")
    pod = cache.pod(namespace, "by-kubectl")
    assert pod is not None and pod.node == NODE
    assert pod.containers[0].requests.cpu == 500
    wait_until(lambda: cache.budgets([namespace]), what="the PDB in the cache")
    assert [b.name for b in cache.budgets([namespace])] == ["cache-pdb"]

    def resolved_priority() -> int | None:
        try:
            return cache.priority_resolver().resolve({"priorityClassName": pc_name}, "spec")[0]
        except ObjectError:
            return None  # the class has not reached the cache yet

    wait_until(lambda: resolved_priority() == 4242, what="the PriorityClass in the resolver")
    # The kubelet starts the pods: their status reaches the cache too.
    wait_until(
        lambda: (
            (p := cache.pod(namespace, "by-client")) is not None
            and p.phase == "Running"
            and "app" in p.statuses
        ),
        what="the running pod's status",
    )

    kubectl("delete", "pod", "by-client", "--grace-period=0", "--force", "--wait=false")
    kubectl("delete", "poddisruptionbudget", "cache-pdb")
    kubectl("delete", "priorityclass", pc_name)
    wait_until(lambda: ours() == ["by-kubectl"], what="the deleted pod to leave the cache")
    wait_until(lambda: not cache.budgets([namespace]), what="the PDB to leave the cache")
    assert cache.pod(namespace, "by-client") is None
    assert ("pods", "ADDED", "by-client") in events
    assert ("pods", "DELETED", "by-client") in events
    assert ("poddisruptionbudgets", "DELETED", "cache-pdb") in events
    wait_until(lambda: ("priorityclasses", "DELETED", pc_name) in events, what="PC deleted")
    assert cache.synced() and cache.age() < 30


def compact_etcd(control_plane: ControlPlane) -> int:
    """Compacts etcd's history up to its current revision (what kube-apiserver does every
    5 minutes); returns that revision."""
    current = control_plane.client.get("/api/v1/namespaces/default/pods", limit=1)
    revision = int(current["metadata"]["resourceVersion"])
    port = control_plane.ports["etcd-client"]
    answer = urllib3.request(
        "POST",
        f"http://127.0.0.1:{port}/v3/kv/compaction",
        body=json.dumps({"revision": str(revision), "physical": True}),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert answer.status == 200, answer.data
    return revision


@pytest.fixture(scope="module")
def uncached_control_plane(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A second API server without its watch cache, so watches are served by etcd and a
    compacted resourceVersion is answered with 410 Gone at once. (The watch cache of the
    shared cluster accepts an old resourceVersion as long as its own window allows, and
    sizes that window by traffic, so it cannot be made to expire one on demand.)"""
    config = ControlPlaneConfig(
        state_dir=tmp_path_factory.mktemp("uncached"),
        scheduler=False,
        controller_manager=False,
        audit=False,
        apiserver_args=("--watch-cache=false",),
    )
    with ControlPlane(cluster.binaries, config) as control_plane:
        yield control_plane


def test_relist_after_410_gone(
    uncached_control_plane: ControlPlane, wait_until: Waiter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.kube.reflector")
    control_plane = uncached_control_plane
    api = make_api_client(str(control_plane.kubeconfig))
    cache = ClusterCache(api)
    cache.start()
    try:
        assert cache.wait_synced(30)
        pods: Reflector[Any] = cache.reflector(PODS)
        stale = pods.resource_version
        # A change only a relist can bring once the history holding it is compacted.
        control_plane.client.create("/api/v1/namespaces/default/pods", pod_body("before-gone"))
        for i in range(3):
            control_plane.client.patch(
                "/api/v1/namespaces/default/pods/before-gone",
                {"metadata": {"labels": {"n": str(i)}}},
            )
        wait_until(
            lambda: (
                (p := cache.pod("default", "before-gone")) is not None and p.labels.get("n") == "2"
            ),
            what="first pod",
        )
        compacted = compact_etcd(control_plane)
        # etcd keeps the compaction revision itself: a watch from `stale` needs stale + 1.
        assert int(stale) + 1 < compacted
        # Resume the watch from before the compaction: 410 Gone, then a relist.
        pods.resource_version = stale
        pods.reconnect()
        wait_until(
            lambda: any("relisting" in r.getMessage() for r in caplog.records),
            what="a relist after 410",
        )
        # Only a relist gets past the compaction: the watch from `stale` ended in 410.
        wait_until(lambda: int(pods.resource_version) >= compacted, what="the relist")
        assert cache.synced() and cache.pod("default", "before-gone") is not None
        control_plane.client.create("/api/v1/namespaces/default/pods", pod_body("after-gone"))
        wait_until(lambda: cache.pod("default", "after-gone") is not None, what="watch again")
        assert int(pods.resource_version) >= compacted
        assert cache.synced()
    finally:
        cache.stop()


def test_stop_is_prompt(api: ApiClient) -> None:
    cache = ClusterCache(api, close_client=False)
    cache.start()
    assert cache.wait_synced(30)
    started = time.monotonic()
    cache.stop()
    # Blocked watch reads are interrupted, not waited out (the read timeout is minutes).
    assert time.monotonic() - started < 5
    assert not any(t.name.startswith("reflector-") for t in threading.enumerate())


# -- the ledger ------------------------------------------------------------------------


def make_entry(i: int, node: str, now: float, ttl: float = 600.0) -> LedgerEntry:
    return LedgerEntry(
        pod=PodRef("default", f"pod-{i}", f"uid-{i}"),
        node=node,
        review_uid=f"review-{i}",
        resources=Resources(100, 2**26),
        desired=(("app", Resources(100, 2**26)),),
        victims=(PodRef("default", f"victim-{i}", f"victim-uid-{i}"),),
        admitted_at=now,
        expires_at=now + ttl,
    )


@pytest.fixture
def ledgers(cluster: Cluster, namespace: str) -> Iterator[list[tuple[LeaseLedger, Metrics]]]:
    out = []
    for replica in ("replica-a", "replica-b"):
        metrics = Metrics()
        ledger = LeaseLedger(
            make_api_client(str(cluster.kubeconfig)),
            Config(namespace=namespace, identity=replica),
            metrics=metrics,
            close_client=True,
        )
        ledger.start()
        out.append((ledger, metrics))
    try:
        for ledger, _ in out:
            assert ledger.wait_synced(30)
        yield out
    finally:
        for ledger, _ in out:
            ledger.stop()


def test_ledger_under_contention_loses_nothing(
    cluster: Cluster,
    ledgers: list[tuple[LeaseLedger, Metrics]],
    namespace: str,
    wait_until: Waiter,
) -> None:
    node = f"contended-{secrets.token_hex(2)}"
    threads_per_ledger = 8
    barrier = threading.Barrier(threads_per_ledger * len(ledgers))
    errors: list[BaseException] = []
    calls = [0] * (threads_per_ledger * len(ledgers))

    def add(index: int, ledger: LeaseLedger) -> None:
        try:
            mine = make_entry(index, node, time.time())

            def change(
                entries: tuple[LedgerEntry, ...],
            ) -> tuple[tuple[LedgerEntry, ...] | None, int]:
                calls[index] += 1
                return (*entries, mine), len(entries)

            barrier.wait(timeout=30)
            ledger.update(node, change)
            # Read-your-writes: this process sees its entry at once, without the watch.
            assert any(e.review_uid == mine.review_uid for e in ledger.entries(node))
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=add, args=(i * len(ledgers) + k, ledger))
        for i in range(threads_per_ledger)
        for k, (ledger, _) in enumerate(ledgers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors

    expected = {f"review-{i}" for i in range(len(threads))}
    lease = cluster.client.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease_name(node)}"
    )
    stored = json.loads(lease["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert {e["review"] for e in stored} == expected
    assert all(lease["metadata"]["labels"][k] == v for k, v in LABELS.items())
    for ledger, _ in ledgers:
        wait_until(
            lambda ledger=ledger: {e.review_uid for e in ledger.entries(node)} == expected,
            what="both ledgers' caches to converge",
        )
        assert ledger.reachable()
    conflicts = sum(
        m.registry.get_sample_value("resize_preemption_ledger_conflicts_total") or 0.0
        for _, m in ledgers
    )
    assert conflicts > 0
    # Each change ran once up front, again on fresh entries after every conflict, and at
    # most once more when its turn came after writes of its own process had gone first
    # (writes of one node take turns in a process: webhook.kube.ledger).
    assert len(threads) + conflicts <= sum(calls) <= 2 * len(threads) + conflicts


def test_ledger_stores_what_a_change_returns_and_keeps_an_empty_lease(
    cluster: Cluster,
    ledgers: list[tuple[LeaseLedger, Metrics]],
    namespace: str,
    wait_until: Waiter,
) -> None:
    (a, _), (b, _) = ledgers
    node = "node-with-a-long-name-" + "x" * 240
    now = time.time()
    live, stale = make_entry(1, node, now), make_entry(2, node, now, ttl=-1)
    # Expired or not, what the change returns is stored: which entries live is the
    # lifecycle's rule, not the store's (tests/e2e/test_ledger_contract.py).
    assert a.update(node, lambda entries: ((*entries, live, stale), "ok")) == "ok"
    both = ["review-1", "review-2"]
    assert both == sorted(e.review_uid for e in a.entries(node))
    wait_until(lambda: sorted(e.review_uid for e in b.entries(node)) == both, what="b sees it")
    assert len(lease_name(node)) <= 253

    # A change returning None writes nothing.
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease_name(node)}"
    version = cluster.client.get(path)["metadata"]["resourceVersion"]
    assert b.update(node, lambda entries: (None, len(entries))) == 2
    assert version == cluster.client.get(path)["metadata"]["resourceVersion"]

    # Emptied: the Lease stays, with an empty list, for reuse.
    b.update(node, lambda entries: ((), None))
    lease = cluster.client.get(path)
    assert lease["metadata"]["annotations"][LEDGER_ANNOTATION] == "[]"
    assert lease["spec"]["holderIdentity"] == "replica-b"
    wait_until(lambda: a.entries(node) == (), what="a sees the emptied ledger")
    assert a.all_entries() == () or all(e.node != node for e in a.all_entries())


def test_ledger_errors_are_cluster_errors(cluster: Cluster) -> None:
    ledger = LeaseLedger(
        make_api_client(str(cluster.kubeconfig)),
        Config(namespace=f"missing-{secrets.token_hex(3)}"),
        close_client=True,
    )
    try:
        # No such namespace: the create is refused with 404, surfaced as a ClusterError.
        with pytest.raises(NotFound):
            ledger.update(
                "node-1", lambda entries: ((*entries, make_entry(1, "node-1", time.time())), None)
            )
        assert ledger.reachable()  # the API server answered
    finally:
        ledger.stop()


def test_ledger_recreates_a_lease_deleted_behind_its_cache(
    cluster: Cluster, ledgers: list[tuple[LeaseLedger, Metrics]], namespace: str
) -> None:
    (a, _), _ = ledgers
    node = "node-deleted"
    now = time.time()
    a.update(node, lambda entries: ((*entries, make_entry(1, node, now)), None))
    # Freeze the cache (no watch), then delete the Lease behind its back.
    a.reflector.stop()
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease_name(node)}"
    cluster.client.delete(path)
    a.update(node, lambda entries: ((*entries, make_entry(2, node, now)), None))
    # Leases allow create-on-update: the PUT brings the Lease back (and, should an API
    # server refuse that with 404, the ledger re-reads and creates it).
    assert {e.review_uid for e in a.entries(node)} == {"review-1", "review-2"}
    stored = json.loads(cluster.client.get(path)["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert {e["review"] for e in stored} == {"review-1", "review-2"}
