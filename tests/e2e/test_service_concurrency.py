"""Ten resizes at once on one full node, answered by two replicas of the service.

node-1 (8 CPU) holds ten high-priority "growers" of 500m and three low-priority pods of
1 CPU: not a millicore free. Every grower asks for 1 CPU at the same moment, through two
``python -m webhook serve`` replicas behind one round-robin front (as a Service spreads
connections over a Deployment's pods), sharing the Lease ledger.

Which resizes are admitted depends on the order the reviews arrive in; what must hold
whatever the order:

* the node is never over-committed: what the kubelet actuated fits allocatable;
* every evicted pod was named as a victim by an admitted resize (an entry in the ledger);
* no surplus victim: the admitted resizes together needed every evicted pod (one victim
  fewer would not have made room for them all);
* the room the victims freed is used: the kubelet actuates two growers per evicted pod.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.kubeapi import WatchExpired
from harness.replicas import ReplicaSet, start_replicas
from tests.e2e.conftest import NODE, Cluster, Kubectl, Waiter
from tests.e2e.service_support import (
    LEASES,
    actual_cpu,
    actual_millicores,
    clear_ledger,
    decision_lines,
    pod_manifest,
    pods_on_node,
    read_pod,
    resize,
    run_pods,
    terminating,
)
from webhook.kube.ledger import LEDGER_ANNOTATION, lease_name

pytestmark = pytest.mark.e2e

GROWERS = [f"grower-{i}" for i in range(10)]
LOWS = [f"low-{i}" for i in range(3)]
ALLOCATABLE_MILLICORES = 8000
GROWTH_MILLICORES = 500  # each grower: 500m -> 1 CPU
VICTIM_MILLICORES = 1000  # what each low-priority pod frees


@dataclass
class LedgerHistory:
    """Every version of node-1's ledger Lease while the test runs, from a watch: which
    pod's resize was admitted (held an entry) and the victims each entry named."""

    cluster: Cluster
    namespace: str
    admitted: dict[str, set[str]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _response: Any = None
    _thread: threading.Thread | None = None

    def start(self) -> LedgerHistory:
        listed = self.cluster.client.get(LEASES)
        for lease in listed["items"]:
            self._record(lease)
        self._thread = threading.Thread(
            target=self._watch, args=(listed["metadata"]["resourceVersion"],), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()
        if self._thread is not None:
            self._thread.join(10)

    def snapshot(self) -> dict[str, set[str]]:
        with self._lock:
            return {pod: set(victims) for pod, victims in self.admitted.items()}

    def _watch(self, version: str) -> None:
        def keep(response: Any) -> None:
            self._response = response

        try:
            while not self._stop.is_set():
                for event in self.cluster.client.watch(
                    LEASES, version, timeout_seconds=120, stop=self._stop, on_response=keep
                ):
                    obj = event["object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj)
        except WatchExpired as e:  # the test would miss versions: make it fail
            self.errors.append(e)
        except Exception as e:
            if not self._stop.is_set():
                self.errors.append(e)

    def _record(self, lease: dict[str, Any]) -> None:
        if lease["metadata"]["name"] != lease_name(NODE):
            return
        raw = (lease["metadata"].get("annotations") or {}).get(LEDGER_ANNOTATION) or "[]"
        with self._lock:
            for entry in json.loads(raw):
                if entry["pod"]["namespace"] != self.namespace:
                    continue
                victims = self.admitted.setdefault(entry["pod"]["name"], set())
                victims |= {v["name"] for v in entry["victims"]}


@pytest.fixture
def replicas(cluster: Cluster, namespace: str) -> Iterator[ReplicaSet]:
    """Two service replicas behind one front, registered, with an empty ledger."""
    clear_ledger(cluster)
    replica_set = start_replicas(
        cluster.client, cluster.kubeconfig, cluster.control_plane.state_dir, count=2
    )
    yield replica_set
    replica_set.stop()
    clear_ledger(cluster)


@pytest.fixture
def ledger_history(cluster: Cluster, namespace: str) -> Iterator[LedgerHistory]:
    history = LedgerHistory(cluster, namespace).start()
    yield history
    history.stop()


def full_node(kubectl: Kubectl, classes: dict[str, str]) -> None:
    run_pods(
        kubectl,
        [
            *(pod_manifest(name, "500m", classes["high"], memory="128Mi") for name in GROWERS),
            *(pod_manifest(name, "1", classes["low"], memory="128Mi") for name in LOWS),
        ],
    )


def test_parallel_resizes_on_two_replicas_never_overcommit_nor_evict_more_than_needed(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    replicas: ReplicaSet,
    ledger_history: LedgerHistory,
    wait_until: Waiter,
) -> None:
    full_node(kubectl, priority_classes)

    with ThreadPoolExecutor(len(GROWERS)) as pool:
        results = list(pool.map(lambda name: resize(kubectl, name, "1"), GROWERS))

    assert [0] * len(GROWERS) == [r.returncode for r in results], [r.stderr for r in results]

    def settled() -> set[str] | None:
        """The evicted lows, once every named victim is gone and the kubelet used the room
        they freed (two growers actuated at 1 CPU per evicted pod)."""
        admitted = ledger_history.snapshot()
        named = set().union(*admitted.values()) if admitted else set()
        lows = {name: read_pod(cluster, namespace, name) for name in LOWS}
        evicted = {name for name, pod in lows.items() if pod is None}
        if not named <= evicted or any(terminating(p) for p in lows.values()):
            return None
        grown = sum(1 for name in GROWERS if actual_cpu(read_pod(cluster, namespace, name)) == "1")
        expected = min(len(GROWERS), len(evicted) * VICTIM_MILLICORES // GROWTH_MILLICORES)
        return evicted if evicted and grown == expected else None

    evicted: set[str] = wait_until(
        settled, timeout=60, interval=0.2, what="the victims to go and the kubelet to resize"
    )
    assert [] == ledger_history.errors

    on_node = pods_on_node(cluster, namespace)
    assert sum(actual_millicores(p) for p in on_node) <= ALLOCATABLE_MILLICORES
    admitted = ledger_history.snapshot()
    named = set().union(*admitted.values())
    assert evicted <= named, f"evicted {sorted(evicted - named)} that no admitted resize named"
    assert set(admitted) <= set(GROWERS)
    # One victim fewer would not have made room for every admitted resize.
    assert (len(evicted) - 1) * VICTIM_MILLICORES < len(admitted) * GROWTH_MILLICORES, (
        f"{len(evicted)} victims for {len(admitted)} admitted resizes: {admitted}"
    )
    assert set(LOWS) - evicted == {p["metadata"]["name"] for p in on_node} & set(LOWS)

    # Both replicas answered reviews of this test (the front spread the API server's
    # connections over them).
    served = {
        replica.identity: decision_lines(replica.log_path, namespace)
        for replica in replicas.replicas
    }
    assert all(served.values()), {k: len(v) for k, v in served.items()}
    assert len(GROWERS) == sum(len(v) for v in served.values())
    reserved = {
        d["pod"].split("/", 1)[1]
        for decisions in served.values()
        for d in decisions
        if d["reserved"]
    }
    assert reserved <= set(admitted)
    assert all(n > 0 for n in replicas.front.connections.values()), replicas.front.connections
